// The rendezvous store over real loopback sockets: launcher/store_server with the runtime client.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "launcher/store_server.hpp"
#include "rendezvous/store_protocol.hpp"
#include "rendezvous/tcp_store_client.hpp"

using namespace std::chrono_literals;
using ddl::launcher::StoreServer;
using ddl::store::TcpStoreClient;

namespace {
const std::string kToken = "0123456789abcdef0123456789abcdef";

std::string address_of(const StoreServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// Connects without waiting for the server to accept; -1 when this process is out of descriptors.
int connect_stranger(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);  // completes in the listen backlog; a failure shows in the test
  return fd;
}

// Lowers this process's RLIMIT_NOFILE to `free_descriptors` above the lowest free descriptor, and
// restores it when destroyed.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(rlim_t free_descriptors) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    int probe = ::open("/dev/null", O_RDONLY);
    ::close(probe);
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(probe) + free_descriptors;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  }
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;

 private:
  rlimit saved_{};
};

// True when the server closed the connection (read returns 0) within `timeout`.
bool closed_by_peer(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c = 0;
  return ::recv(fd, &c, 1, 0) == 0;
}
}  // namespace

TEST_CASE("set, get, add, delete") {
  StoreServer server({.token = kToken});
  TcpStoreClient c(address_of(server), kToken, 5s);
  c.set("a", "hello");
  CHECK(c.get("a") == "hello");
  CHECK(c.try_get("missing") == std::nullopt);
  CHECK(c.add("n", 5) == 5);
  CHECK(c.add("n", -2) == 3);
  CHECK(c.get("n") == "3");
  CHECK(c.remove("a"));
  CHECK_FALSE(c.remove("a"));
  CHECK(c.try_get("a") == std::nullopt);
  std::string binary("\0\xff\n", 3);
  c.set("bin", binary);
  CHECK(c.get("bin") == binary);
}

TEST_CASE("add on a key that holds text is an error naming the key") {
  StoreServer server({.token = kToken});
  TcpStoreClient c(address_of(server), kToken, 5s);
  c.set("word", "abc");
  CHECK_THROWS_WITH_AS(c.add("word", 1), "store add 'word' failed: key 'word' does not hold an integer", ddl::Error);
}

TEST_CASE("add counts only on a whole integer in 64 bits: no blanks, trailing bytes or silent clamping") {
  StoreServer server({.token = kToken});
  TcpStoreClient c(address_of(server), kToken, 5s);
  for (const std::string& held : std::vector<std::string>{" 5", "5 ", std::string("5\0junk", 6), "+5", "99999999999999999999", "0x10"}) {
    c.set("held", held);
    CHECK_THROWS_WITH_AS(c.add("held", 1), "store add 'held' failed: key 'held' does not hold an integer", ddl::Error);
  }
  c.set("held", "-7");
  CHECK(c.add("held", 2) == -5);
}

TEST_CASE("a burst of many pipelined requests is answered whole and in order") {
  // 20000 sets, then a get of each tenth, sent before reading any answer: the server handles the
  // burst in batches, rather than moving the rest of its buffer after every request.
  StoreServer server({.token = kToken});
  int fd = raw_connect(server.port());
  using ddl::store::Op;
  using ddl::store::Status;
  using ddl::store::Writer;
  constexpr int kSets = 20000;
  std::string requests = Writer().u8(static_cast<uint8_t>(Op::Auth)).str(kToken).frame();
  std::string want = Writer().u8(static_cast<uint8_t>(Status::Ok)).frame();
  for (int i = 0; i < kSets; ++i) {
    requests += Writer().u8(static_cast<uint8_t>(Op::Set)).str("k" + std::to_string(i)).str(std::string(100, 'x')).frame();
    want += Writer().u8(static_cast<uint8_t>(Status::Ok)).frame();
  }
  for (int i = 0; i < kSets; i += 10) {
    requests += Writer().u8(static_cast<uint8_t>(Op::Get)).str("k" + std::to_string(i)).frame();
    want += Writer().u8(static_cast<uint8_t>(Status::Ok)).str(std::string(100, 'x')).frame();
  }
  std::thread sender([&] { REQUIRE(::send(fd, requests.data(), requests.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(requests.size())); });
  timeval tv{60, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string replies;
  char buf[65536];
  while (replies.size() < want.size()) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    replies.append(buf, static_cast<size_t>(n));
  }
  sender.join();
  ::close(fd);
  CHECK(replies == want);
}

TEST_CASE("get waits for a key another client sets later") {
  StoreServer server({.token = kToken});
  TcpStoreClient waiter(address_of(server), kToken, 5s);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    TcpStoreClient(address_of(server), kToken, 5s).set("late", "value");
  });
  CHECK(waiter.get("late") == "value");
  setter.join();
}

TEST_CASE("wait times out on the server's clock with a clear error") {
  StoreServer server({.token = kToken});
  TcpStoreClient c(address_of(server), kToken, 5s);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(c.wait({"never", "also-never"}, 200ms), "store wait for 'never' and 1 more keys timed out after 200 ms", ddl::Error);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 200ms);
  c.set("after", "the timeout");  // the connection is still usable
  CHECK(c.get("after") == "the timeout");
}

TEST_CASE("a wrong token is refused: the client says so and the server counts it") {
  StoreServer server({.token = kToken});
  CHECK_THROWS_WITH_AS(TcpStoreClient(address_of(server), "wrong", 5s),
                       ("the ddl store at " + address_of(server) + " refused this connection").c_str(), ddl::Error);
  CHECK(server.rejected_connections() == 1);
}

TEST_CASE("a wrong token gets nothing written back, and a request without a token is refused") {
  std::vector<std::string> log;
  StoreServer server({.token = kToken, .log = [&](const std::string& m) { log.push_back(m); }});
  int fd = raw_connect(server.port());
  std::string set = ddl::store::Writer().u8(static_cast<uint8_t>(ddl::store::Op::Set)).str("k").str("v").frame();
  REQUIRE(::send(fd, set.data(), set.size(), 0) == static_cast<ssize_t>(set.size()));
  CHECK(closed_by_peer(fd, 2000ms));  // read returned 0: closed with no byte written
  ::close(fd);
  TcpStoreClient good(address_of(server), kToken, 5s);
  CHECK(good.try_get("k") == std::nullopt);  // the unauthenticated Set was not applied
  CHECK(server.rejected_connections() == 1);
}

TEST_CASE("rejections are logged once, then counted") {
  std::vector<std::string> log;
  std::mutex m;
  StoreServer server({.token = kToken, .log = [&](const std::string& s) {
                        std::lock_guard l(m);
                        log.push_back(s);
                      }});
  for (int i = 0; i < 3; ++i) CHECK_THROWS(TcpStoreClient(address_of(server), "nope", 5s));
  CHECK(server.rejected_connections() == 3);
  std::lock_guard l(m);
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("wrong or missing DDL_STORE_TOKEN") != std::string::npos);
}

TEST_CASE("a connection that never authenticates is closed after the auth timeout") {
  StoreServer server({.token = kToken, .auth_timeout = 200ms});
  int fd = raw_connect(server.port());
  CHECK(closed_by_peer(fd, 3000ms));
  ::close(fd);
  CHECK(server.rejected_connections() == 1);
}

TEST_CASE("connecting retries until the deadline, then names the address") {
  uint16_t port = 0;
  {
    StoreServer gone({.token = kToken});
    port = gone.port();
  }
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(TcpStoreClient("127.0.0.1:" + std::to_string(port), kToken, 300ms), ddl::Error);
  CHECK(std::chrono::steady_clock::now() - start >= 250ms);
}

TEST_CASE("malformed addresses are errors naming the address") {
  CHECK_THROWS_WITH_AS(ddl::store::parse_host_port("nohost", "store address"), "store address 'nohost' is not host:port", ddl::Error);
  CHECK_THROWS_WITH_AS(ddl::store::parse_host_port("h:99999", "store address"), "store address 'h:99999' has no valid port", ddl::Error);
  CHECK(ddl::store::parse_host_port("[::1]:80", "x") == std::pair<std::string, uint16_t>{"::1", 80});
}

TEST_CASE("256 clients meet at a barrier and read each other's keys") {
  StoreServer server({.token = kToken});
  constexpr int n = 256;
  std::atomic<int> correct{0};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      TcpStoreClient c(address_of(server), kToken, 30s);
      c.set("addr/" + std::to_string(rank), "host" + std::to_string(rank));
      c.barrier("start", n);
      int next = (rank + 1) % n;
      if (c.get("addr/" + std::to_string(next)) == "host" + std::to_string(next) && c.get("addr/0") == "host0") ++correct;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(correct == n);
  TcpStoreClient c(address_of(server), kToken, 5s);
  CHECK(c.get("start/arrived") == std::to_string(n));
}

TEST_CASE("constant-time comparison is still a comparison") {
  CHECK(ddl::store::constant_time_equal("abc", "abc"));
  CHECK_FALSE(ddl::store::constant_time_equal("abc", "abd"));
  CHECK_FALSE(ddl::store::constant_time_equal("abc", "abcd"));
  CHECK_FALSE(ddl::store::constant_time_equal("", "a"));
  CHECK(ddl::store::constant_time_equal("", ""));
}

TEST_CASE("a client without the token cannot make the server buffer what it streams") {
  StoreServer server({.token = kToken});
  int fd = raw_connect(server.port());
  // A length prefix of a frame small enough to be an auth frame, then far more bytes than it.
  std::string prefix("\x00\x00\x10\x00", 4);  // 4096 bytes follow
  REQUIRE(::send(fd, prefix.data(), prefix.size(), 0) == 4);
  std::string chunk(1 << 20, 'x');
  size_t sent = 0;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (sent < (64u << 20)) {
    ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;  // reset by the server, or the kernel's buffers are full and it reads no more
    sent += static_cast<size_t>(n);
  }
  ::close(fd);
  // The kernel's socket buffers take a few MiB; the server must not have drained 64 MiB into memory.
  CHECK(sent < (16u << 20));
  CHECK(server.rejected_connections() == 1);
  TcpStoreClient good(address_of(server), kToken, 5s);  // and it still serves
  good.set("k", "v");
  CHECK(good.get("k") == "v");
}

TEST_CASE("hundreds of waits expiring while their clients reset leave the server serving") {
  StoreServer server({.token = kToken});
  std::vector<int> fds;
  std::string auth = ddl::store::Writer().u8(static_cast<uint8_t>(ddl::store::Op::Auth)).str(kToken).frame();
  std::string wait = ddl::store::Writer().u8(static_cast<uint8_t>(ddl::store::Op::Wait)).u32(1).str("never").i64(300).frame();
  for (int i = 0; i < 300; ++i) {
    int fd = raw_connect(server.port());
    std::string both = auth + wait;
    REQUIRE(::send(fd, both.data(), both.size(), 0) == static_cast<ssize_t>(both.size()));
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(250ms);
  for (int fd : fds) {  // reset (RST, not FIN) just before the waits expire
    linger hard{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(fd);
  }
  std::this_thread::sleep_for(200ms);
  TcpStoreClient good(address_of(server), kToken, 5s);
  good.set("alive", "yes");
  CHECK(good.get("alive") == "yes");
}

TEST_CASE("extreme wait timeouts and additions are answered, not undefined") {
  StoreServer server({.token = kToken});
  TcpStoreClient c(address_of(server), kToken, 5s);
  c.set("max", std::to_string(INT64_MAX));
  CHECK_THROWS_WITH_AS(c.add("max", 1), "store add 'max' failed: add to key 'max' overflows 64 bits", ddl::Error);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    TcpStoreClient(address_of(server), kToken, 5s).set("later", "1");
  });
  c.wait({"later"}, std::chrono::milliseconds(INT64_MAX));  // a deadline past the clock's range
  setter.join();
  CHECK(c.get("later") == "1");
}

TEST_CASE("requests followed by a half-close are answered before the server closes") {
  StoreServer server({.token = kToken});
  TcpStoreClient(address_of(server), kToken, 5s).set("k", "v");
  int fd = raw_connect(server.port());
  using ddl::store::Op;
  using ddl::store::Writer;
  std::string requests = Writer().u8(static_cast<uint8_t>(Op::Auth)).str(kToken).frame() +
                         Writer().u8(static_cast<uint8_t>(Op::Wait)).u32(1).str("later").i64(5000).frame() +
                         Writer().u8(static_cast<uint8_t>(Op::Get)).str("k").frame();
  REQUIRE(::send(fd, requests.data(), requests.size(), 0) == static_cast<ssize_t>(requests.size()));
  REQUIRE(::shutdown(fd, SHUT_WR) == 0);  // done sending; still reading
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    TcpStoreClient(address_of(server), kToken, 5s).set("later", "1");
  });
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string replies;
  char buf[256];
  for (ssize_t n = 0; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) replies.append(buf, static_cast<size_t>(n));  // until the server closes
  setter.join();
  ::close(fd);
  // Three replies: auth Ok, wait Ok (once "later" was set), and the Get's value.
  std::string want = Writer().u8(static_cast<uint8_t>(ddl::store::Status::Ok)).frame() +
                     Writer().u8(static_cast<uint8_t>(ddl::store::Status::Ok)).frame() +
                     Writer().u8(static_cast<uint8_t>(ddl::store::Status::Ok)).str("v").frame();
  CHECK(replies == want);
}

TEST_CASE("after a reply comes too late, the client drops the connection instead of reading it as the next answer") {
  // A fake store: accepts, answers the auth, then answers the next request only after 1 s.
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  using ddl::store::Status;
  using ddl::store::Writer;
  std::thread fake([&] {
    int fd = ::accept(listener, nullptr, nullptr);
    char buf[4096];
    ::recv(fd, buf, sizeof buf, 0);  // the auth frame
    std::string ok = Writer().u8(static_cast<uint8_t>(Status::Ok)).frame();
    ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    ::recv(fd, buf, sizeof buf, 0);  // the set
    std::this_thread::sleep_for(1000ms);
    std::string late = Writer().u8(static_cast<uint8_t>(Status::Ok)).str("stale").frame();
    ::send(fd, late.data(), late.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(500ms);
    ::close(fd);
  });
  {
    TcpStoreClient c(address, kToken, 300ms);
    CHECK_THROWS_WITH_AS(c.set("k", "v"), doctest::Contains("timed out"), ddl::Error);
    std::this_thread::sleep_for(1200ms);  // the late reply has arrived by now
    CHECK_THROWS_WITH_AS(c.try_get("k"), doctest::Contains("was dropped after an earlier failure"), ddl::Error);
  }
  fake.join();
  ::close(listener);
}

TEST_CASE("out of descriptors, the oldest silent stranger makes room for a worker that connects") {
  StoreServer server({.token = kToken});
  std::vector<int> strangers;
  {
    // The server and these clients share one process's descriptors: 40 are free, the strangers
    // below need two each (their socket and the server's end), so the server runs out.
    DescriptorLimit limit(40);
    int kept_for_the_worker = ::open("/dev/null", O_RDONLY);
    REQUIRE(kept_for_the_worker >= 0);
    for (int i = 0; i < 30; ++i) {
      int fd = connect_stranger(server.port());
      if (fd < 0) break;
      strangers.push_back(fd);
    }
    std::this_thread::sleep_for(300ms);  // the server has accepted what it could
    ::close(kept_for_the_worker);
    // Without room made, this waits until the strangers' auth timeout (30 s) and fails at 3 s.
    TcpStoreClient worker(address_of(server), kToken, 3s);
    worker.set("k", "v");
    CHECK(worker.get("k") == "v");
  }
  CHECK(server.rejected_connections() >= 1);
  for (int fd : strangers) ::close(fd);
}
