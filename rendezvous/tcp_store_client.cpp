#include "rendezvous/tcp_store_client.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/worker_contract.hpp"
#include "rendezvous/store_protocol.hpp"

namespace ddl::store {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::pair<std::string, uint16_t> parse_host_port(const std::string& address, const char* what) {
  std::string host;
  std::string port;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
      throw Error(fmt::format("{} '{}' is not host:port", what, address), "write it as [ipv6]:port");
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw Error(fmt::format("{} '{}' is not host:port", what, address), "write it as host:port, e.g. node01:29500");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535)
    throw Error(fmt::format("{} '{}' has no valid port", what, address), "the port must be a number from 1 to 65535");
  return {host, static_cast<uint16_t>(p)};
}

namespace {

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd until the deadline; false when the deadline passed.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// One non-blocking connect attempt to any address of host:port; returns the fd or -1.
int try_connect(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    last_error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(gai));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline)) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last_error = errno ? std::strerror(errno) : "connect timed out";
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

bool send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, POLLOUT, deadline)) continue;
    return false;
  }
  return true;
}

enum class RecvResult { Ok, Closed, TimedOut };

RecvResult recv_exact(int fd, char* out, size_t size, Clock::time_point deadline) {
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::recv(fd, out + got, size - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return RecvResult::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return RecvResult::TimedOut;
      continue;
    }
    return RecvResult::Closed;
  }
  return RecvResult::Ok;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& address, const std::string& token, milliseconds timeout)
    : address_(address), timeout_(timeout) {
  auto [host, port] = parse_host_port(address, "store address");
  const auto deadline = Clock::now() + timeout;
  auto backoff = milliseconds(10);
  std::string last_error = "timed out";
  // Connection refused is normal while the server's backlog is full or it is still starting.
  while ((fd_ = try_connect(host, port, deadline, last_error)) < 0) {
    const auto now = Clock::now();
    if (now >= deadline)
      throw Error(fmt::format("cannot connect to the ddl store at {} within {} ms: {}", address, timeout.count(), last_error),
                  "is `ddl run` still running, and is DDL_STORE_ADDR reachable from this host?");
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  uint8_t status = 0;
  call(Writer().u8(static_cast<uint8_t>(Op::Auth)).str(token).frame(), "authenticate", "", deadline, &status);
}

TcpStoreClient TcpStoreClient::from_environment() {
  const char* addr = std::getenv(contract::kStoreAddr);
  const char* token = std::getenv(contract::kStoreToken);
  if (addr == nullptr || token == nullptr)
    throw Error("DDL_STORE_ADDR and DDL_STORE_TOKEN are not set", "start the program with `ddl run`");
  return TcpStoreClient(addr, token, ddl::timeout_from_environment());
}

TcpStoreClient::TcpStoreClient(TcpStoreClient&& other) noexcept
    : fd_(other.fd_), address_(std::move(other.address_)), timeout_(other.timeout_) {
  other.fd_ = -1;
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::call(const std::string& request, const char* what, const std::string& key, Clock::time_point deadline,
                                 uint8_t* status) {
  auto where = [&] { return key.empty() ? std::string(what) : fmt::format("{} '{}'", what, key); };
  if (fd_ < 0)
    throw Error(fmt::format("store {} failed: the connection to {} was dropped after an earlier failure", where(), address_),
                "connect again (a late reply to the failed request would have answered this one)");
  // Any failure below leaves the stream between frames unknown: the connection is given up, so a
  // reply that arrives late cannot be taken for the answer to the next request.
  struct DropUnlessDone {
    int& fd;
    bool done = false;
    ~DropUnlessDone() {
      if (!done && fd >= 0) {
        ::close(fd);
        fd = -1;
      }
    }
  } drop{fd_};
  if (!send_all(fd_, request, deadline))
    throw Error(fmt::format("store {} failed: cannot send to {}", where(), address_), "the ddl run that hosts the store may have ended");
  char header[4];
  RecvResult r = recv_exact(fd_, header, 4, deadline);
  std::string body;
  if (r == RecvResult::Ok) {
    uint32_t length = *peek_frame_length(std::string_view(header, 4));
    if (length == 0 || length > kMaxFrameBytes) throw Error(fmt::format("store {} failed: malformed reply from {}", where(), address_));
    body.resize(length);
    r = recv_exact(fd_, body.data(), length, deadline);
  }
  if (r == RecvResult::TimedOut)
    throw TimeoutError(fmt::format("store {} timed out at {}", where(), address_),
                       "raise DDL_TIMEOUT, or look for a rank that never arrived");
  if (r == RecvResult::Closed) {
    if (request[4] == static_cast<char>(Op::Auth))
      throw Error(fmt::format("the ddl store at {} refused this connection", address_),
                  "DDL_STORE_TOKEN must be the token of the ddl run that hosts the store");
    throw Error(fmt::format("store {} failed: {} closed the connection", where(), address_),
                "the ddl run that hosts the store may have ended");
  }
  drop.done = true;  // a whole reply arrived: the stream is at a frame boundary again
  *status = static_cast<uint8_t>(body[0]);
  if (*status == static_cast<uint8_t>(Status::Error))
    throw Error(
        fmt::format("store {} failed: {}", where(), Reader(std::string_view(body).substr(1)).str().value_or("malformed error reply")));
  return body.substr(1);
}

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  uint8_t status = 0;
  call(Writer().u8(static_cast<uint8_t>(Op::Set)).str(key).str(value).frame(), "set", key, Clock::now() + timeout_, &status);
}

std::optional<std::string> TcpStoreClient::try_get(const std::string& key) {
  uint8_t status = 0;
  std::string payload = call(Writer().u8(static_cast<uint8_t>(Op::Get)).str(key).frame(), "get", key, Clock::now() + timeout_, &status);
  if (status == static_cast<uint8_t>(Status::NotFound)) return std::nullopt;
  auto value = Reader(payload).str();
  if (!value) throw Error(fmt::format("store get '{}' failed: malformed reply", key));
  return value;
}

std::string TcpStoreClient::get(const std::string& key) {
  wait({key});
  auto value = try_get(key);
  if (!value) throw Error(fmt::format("store get '{}' failed: the key was deleted while waiting for it", key));
  return *value;
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  uint8_t status = 0;
  std::string payload =
      call(Writer().u8(static_cast<uint8_t>(Op::Add)).str(key).i64(delta).frame(), "add", key, Clock::now() + timeout_, &status);
  auto value = Reader(payload).i64();
  if (!value) throw Error(fmt::format("store add '{}' failed: malformed reply", key));
  return *value;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Writer w;
  w.u8(static_cast<uint8_t>(Op::Wait)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(timeout.count());
  const std::string first = keys.empty() ? std::string() : keys.front();
  // The server enforces `timeout`; the socket deadline leaves it a margin to say so itself. Both
  // clamp it to a year, so that no timeout overflows the clock.
  uint8_t status = 0;
  const milliseconds bounded = std::clamp(timeout, milliseconds(0), milliseconds(365LL * 24 * 3600 * 1000));
  call(w.frame(), "wait", first, Clock::now() + bounded + milliseconds(2000), &status);
  if (status == static_cast<uint8_t>(Status::Timeout))
    throw TimeoutError(fmt::format("store wait for '{}'{} timed out after {} ms", first,
                                   keys.size() > 1 ? fmt::format(" and {} more keys", keys.size() - 1) : "", timeout.count()),
                       "a rank did not arrive: look for one that failed or is stuck, or raise DDL_TIMEOUT");
}

bool TcpStoreClient::remove(const std::string& key) {
  uint8_t status = 0;
  std::string payload =
      call(Writer().u8(static_cast<uint8_t>(Op::Delete)).str(key).frame(), "delete", key, Clock::now() + timeout_, &status);
  auto existed = Reader(payload).i64();
  return existed && *existed != 0;
}

void TcpStoreClient::barrier(const std::string& name, int64_t count) {
  const std::string done_key = name + "/done";
  if (add(name + "/arrived", 1) == count) set(done_key, "1");
  wait({done_key});
}

}  // namespace ddl::store
