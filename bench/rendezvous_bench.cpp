// Rendezvous benchmark: N store clients, as a job's ranks would, each set a key, join a barrier
// counter, wait for it, then read rank 0's key and both ring neighbours' keys. Run it as a worker
// of `ddl run` so that it talks to the store ddl hosts:
//   ddl run -np 1 -- ddl_rendezvous_bench --clients 4096
// Every value read is checked; a wrong one or a failed call exits 1.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "launcher/host.hpp"
#include "rendezvous/tcp_store_client.hpp"

using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

std::string value_of(int rank) { return "addr-of-rank-" + std::to_string(rank); }

}  // namespace

int main(int argc, char** argv) {
  int clients = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--clients") == 0 && i + 1 < argc) clients = std::atoi(argv[++i]);
  }
  const char* addr = std::getenv("DDL_STORE_ADDR");
  const char* token = std::getenv("DDL_STORE_TOKEN");
  if (clients < 1 || addr == nullptr || token == nullptr) {
    std::fprintf(stderr, "usage: ddl run -np 1 -- ddl_rendezvous_bench --clients N   (N >= 1)\n");
    return 2;
  }
  ddl::launcher::raise_open_file_limit();
  const std::string prefix = "bench/" + std::to_string(clients) + "/";
  std::atomic<int> failures{0};
  std::atomic<int> connected{0};
  std::vector<double> connect_done(clients), all_done(clients);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(clients);
  for (int rank = 0; rank < clients; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ddl::store::TcpStoreClient c(addr, token, std::chrono::seconds(120));
        connect_done[rank] = ms_between(start, Clock::now());
        ++connected;
        c.set(prefix + std::to_string(rank), value_of(rank));
        c.barrier(prefix + "barrier", clients);
        const int left = (rank + clients - 1) % clients;
        const int right = (rank + 1) % clients;
        for (int peer : {0, left, right})
          if (c.get(prefix + std::to_string(peer)) != value_of(peer)) ++failures;
        all_done[rank] = ms_between(start, Clock::now());
      } catch (const ddl::Error& e) {
        if (failures++ == 0) std::fprintf(stderr, "client %d: %s\n", rank, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double total = ms_between(start, Clock::now());
  double last_connect = 0;
  for (double t : connect_done) last_connect = std::max(last_connect, t);
  std::printf("clients %d: all done in %.1f ms (last connect at %.1f ms); %d failures\n", clients, total, last_connect, failures.load());
  return failures == 0 && connected == clients ? 0 : 1;
}
