#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "runtime/src/core/copy_bytes.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {

namespace {

// Runs one Gloo call, its failures as ddl's typed transport errors. Gloo throws IoException both
// when a peer does not answer in time and when a connection breaks; only its message (tcp/pair.cc:
// "Timed out waiting ...") tells them apart, so this is the one place that reads it.
template <typename Fn>
void gloo_call(Fn fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos) throw TimeoutError(what);
    throw PeerLostError(what);
  }
}

// Runs a Gloo collective on raw bytes of the given element width.
template <typename Fn>
void with_element_type(size_t element_size, Fn fn) {
  switch (element_size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
  }
}

// Gloo's TCP device looks `host` up and uses the answer unchecked: a name that does not resolve
// (a compute node whose name DNS does not know, a mistyped DDL_GLOO_ADDR) crashed every rank.
void require_resolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc != 0)
    throw Error(
        fmt::format("the address this rank gives its peers for Gloo, '{}', does not resolve here ({}): set DDL_GLOO_ADDR to "
                    "this host's address on the network the other hosts reach",
                    host, ::gai_strerror(rc)));
}

class GlooCollectives final : public Collectives {
 public:
  GlooCollectives(int rank, int size, gloo::rendezvous::Store& store, const std::string& host, std::chrono::milliseconds timeout)
      : timeout_(timeout) {
    require_resolvable(host);
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    gloo_call([&] { context->connectFullMesh(store, device); });
    context_ = context;
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  std::vector<std::string> allgather_bytes(const std::string& mine) override {
    std::vector<int64_t> sizes(static_cast<size_t>(size()));
    int64_t my_size = static_cast<int64_t>(mine.size());
    gloo::AllgatherOptions sizes_opts(context_);
    sizes_opts.setInput(&my_size, 1);
    sizes_opts.setOutput(sizes.data(), sizes.size());
    sizes_opts.setTimeout(timeout_);
    gloo_call([&] { gloo::allgather(sizes_opts); });
    std::vector<size_t> counts(sizes.begin(), sizes.end());
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::string all(total, '\0');
    allgatherv(mine.data(), all.data(), counts);
    std::vector<std::string> out;
    size_t offset = 0;
    for (size_t c : counts) {
      out.push_back(all.substr(offset, c));
      offset += c;
    }
    return out;
  }

  void allreduce(void* data, size_t bytes, size_t element_size, ReduceFunction reduce) override {
    if (bytes == 0) return;
    with_element_type(element_size, [&](auto type) {
      using T = decltype(type);
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<T*>(data), bytes / element_size);
      opts.setReduceFunction(reduce);
      opts.setTimeout(timeout_);
      gloo_call([&] { gloo::allreduce(opts); });
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    gloo_call([&] { gloo::broadcast(opts); });
  }

  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) override {
    size_t total = 0;
    for (size_t b : bytes_per_rank) total += b;
    if (total == 0) return;
    gloo::AllgathervOptions opts(context_);
    // Gloo wants a mutable input pointer; it only reads from it.
    const size_t mine = bytes_per_rank[static_cast<size_t>(rank())];
    opts.setInput(input_apart_from(send, mine, recv, total), mine);
    opts.setOutput(static_cast<uint8_t*>(recv), bytes_per_rank);
    opts.setTimeout(timeout_);
    gloo_call([&] { gloo::allgatherv(opts); });
  }

  void alltoall(const void* send, void* recv, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return;
    const size_t total = bytes_per_rank * static_cast<size_t>(size());
    gloo::AlltoallOptions opts(context_);
    opts.setInput(input_apart_from(send, total, recv, total), total);
    opts.setOutput(static_cast<uint8_t*>(recv), total);
    opts.setTimeout(timeout_);
    gloo_call([&] { gloo::alltoall(opts); });
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo_call([&] { gloo::barrier(opts); });
  }

 private:
  // Gloo writes its output while it still reads its input (alltoall receives a peer's block before
  // it has sent all of its own): an input that shares memory with the output (an op's send may be
  // its recv) is copied first, else blocks not yet sent are overwritten. Gloo wants a mutable input
  // pointer; it only reads from it.
  uint8_t* input_apart_from(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes) {
    const auto* in = static_cast<const uint8_t*>(send);
    if (!bytes_overlap(send, send_bytes, recv, recv_bytes)) return const_cast<uint8_t*>(in);
    staged_input_.assign(in, in + send_bytes);
    return staged_input_.data();
  }

  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  std::vector<uint8_t> staged_input_;  // input_apart_from's copy (the engine runs one collective at a time)
};

}  // namespace

std::unique_ptr<Collectives> make_gloo_collectives(int rank, int size, gloo::rendezvous::Store& store, const std::string& interface_host,
                                                   std::chrono::milliseconds timeout) {
  return std::make_unique<GlooCollectives>(rank, size, store, interface_host, timeout);
}

}  // namespace ddl::runtime
