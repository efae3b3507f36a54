// Fuzz target `store`: the rendezvous store's wire format (rendezvous/store_protocol) and how
// the store server (launcher/store_server) parses and answers a client's bytes.
//
// The server's per-connection parsing lives inside its epoll loop and cannot be called without
// sockets, so every input goes to a real StoreServer on loopback, fresh per input (no state carries
// over from one input to the next), through a TCP connection of the harness:
//
//   byte 0   flags: bit 0 - the harness sends a valid Auth frame first, so that mutations reach
//                           the request handlers; without it the input must authenticate itself
//                   bit 1 - the harness half-closes after sending (the server must answer every
//                           whole request, then close)
//   rest     the bytes the client sends, as they are, except that the timeout of every well-formed
//            Wait request is lowered to at most 1 ms (a Wait for a key nobody sets would otherwise
//            hold the input for as long as it asks, up to the server's one-year cap)
//
// Oracle, besides ASan/UBSan: the harness predicts from the frames alone how many answers the
// server owes (one per whole request, until a frame that must close the connection: a wrong or
// missing token, a zero-length or oversized frame) and whether it must close; every answer must be
// a well-formed frame with a known status; 10 s without progress is a hang. In-process, every whole
// request is also decoded with store::Reader and, when it decodes exactly, encoded again with
// store::Writer: the bytes must be the same; constant_time_equal must agree with ==.
//
// Each input runs in a network namespace of the harness's own when the harness may make one (root,
// or unprivileged user namespaces), so its thousands of short connections per second never take
// ports from anything else on the machine; otherwise it stays in the machine's namespace.
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "launcher/store_server.hpp"
#include "rendezvous/store_protocol.hpp"

using namespace ddl::store;

namespace {

const std::string kToken = "fuzz-token-0123456789abcdef";

[[noreturn]] void finding(const char* what, size_t a = 0, size_t b = 0) {
  std::fprintf(stderr, "fuzz_store: %s (%zu, %zu)\n", what, a, b);
  std::abort();
}

// --- in-process: the protocol's decoders ----------------------------------------------------

void check_roundtrip(std::string_view body) {
  Reader r(body);
  Writer w;
  auto op = r.u8();
  if (!op) return;
  w.u8(*op);
  switch (static_cast<Op>(*op)) {
    case Op::Auth:
    case Op::Get:
    case Op::Delete: {
      auto s = r.str();
      if (!s) return;
      w.str(*s);
      if (static_cast<Op>(*op) == Op::Auth && constant_time_equal(*s, kToken) != (*s == kToken))
        finding("constant_time_equal disagrees with ==", s->size(), kToken.size());
      break;
    }
    case Op::Set: {
      auto k = r.str();
      auto v = r.str();
      if (!k || !v) return;
      w.str(*k).str(*v);
      break;
    }
    case Op::Add: {
      auto k = r.str();
      auto d = r.i64();
      if (!k || !d) return;
      w.str(*k).i64(*d);
      break;
    }
    case Op::Wait: {
      auto n = r.u32();
      if (!n) return;
      w.u32(*n);
      for (uint32_t i = 0; i < *n; ++i) {
        auto k = r.str();
        if (!k) return;
        w.str(*k);
      }
      auto t = r.i64();
      if (!t) return;
      w.i64(*t);
      break;
    }
    default: return;
  }
  if (!r.at_end()) return;
  const std::string frame = w.frame();
  if (peek_frame_length(frame) != body.size() || std::string_view(frame).substr(4) != body)
    finding("Writer does not reproduce a request Reader decoded", frame.size(), body.size());
}

// --- the harness's own reading of the frames: what the server must do ------------------------

uint32_t le32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

bool is_valid_auth(std::string_view body) {
  if (body.size() < 5 || static_cast<uint8_t>(body[0]) != static_cast<uint8_t>(Op::Auth)) return false;
  const uint32_t n = le32(body.data() + 1);
  return body.size() == 5 + static_cast<size_t>(n) && body.substr(5) == kToken;
}

// The offset of a Wait request's i64 timeout within its body, when the body holds one.
std::optional<size_t> wait_timeout_offset(std::string_view body) {
  if (body.empty() || static_cast<uint8_t>(body[0]) != static_cast<uint8_t>(Op::Wait) || body.size() < 5) return std::nullopt;
  const uint32_t count = le32(body.data() + 1);
  size_t at = 5;
  for (uint32_t i = 0; i < count; ++i) {
    if (body.size() - at < 4) return std::nullopt;
    const uint32_t n = le32(body.data() + at);
    at += 4;
    if (body.size() - at < n) return std::nullopt;
    at += n;
  }
  if (body.size() - at < 8) return std::nullopt;
  return at;
}

struct Expectation {
  size_t answers = 0;   // answers the server owes
  bool closes = false;  // whether it then closes the connection
};

// Walks the frames as the server must: lowers Wait timeouts in `wire` and predicts the answers.
Expectation walk(std::string& wire, bool authenticated, bool half_close) {
  Expectation e;
  size_t at = 0;
  while (wire.size() - at >= 4) {
    const uint32_t length = le32(wire.data() + at);
    const uint32_t limit = authenticated ? kMaxFrameBytes : kMaxAuthFrameBytes;
    if (length == 0 || length > limit) return {e.answers, true};
    if (wire.size() - at - 4 < length) break;  // a partial frame: never answered
    std::string_view body(wire.data() + at + 4, length);
    check_roundtrip(body);
    if (!authenticated) {
      if (!is_valid_auth(body)) return {e.answers, true};
      authenticated = true;
    } else if (auto t = wait_timeout_offset(body)) {
      int64_t ms = 0;
      for (int i = 0; i < 8; ++i) ms |= static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint8_t>(body[*t + i])) << (8 * i));
      if (ms > 1)
        for (int i = 0; i < 8; ++i) wire[at + 4 + *t + i] = static_cast<char>(i == 0 ? 1 : 0);
    }
    ++e.answers;
    at += 4 + length;
  }
  e.closes = half_close;
  return e;
}

// --- the client --------------------------------------------------------------------------

// A namespace of our own with loopback up and the whole port range: see the comment at the top.
void enter_private_network() {
  if (::unshare(CLONE_NEWNET) != 0 && ::unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "fuzz_store: no network namespace of its own (%s); using the machine's loopback\n", std::strerror(errno));
    return;
  }
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (s < 0 || ::ioctl(s, SIOCGIFFLAGS, &ifr) != 0 || (ifr.ifr_flags |= IFF_UP, ::ioctl(s, SIOCSIFFLAGS, &ifr)) != 0) {
    std::fprintf(stderr, "fuzz_store: cannot bring up loopback in the new network namespace: %s\n", std::strerror(errno));
    std::exit(1);
  }
  ::close(s);
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "w")) {
    std::fputs("1024 65535\n", f);
    std::fclose(f);
  }
}

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  int rc = fd < 0 ? -1 : ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno == EINTR) {
    // libFuzzer's SIGALRM (its -timeout watchdog) interrupted the connect, which goes on by
    // itself: wait until it is done and take its outcome.
    pollfd p{fd, POLLOUT, 0};
    while (::poll(&p, 1, 10'000) < 0 && errno == EINTR) {}
    int error = 0;
    socklen_t length = sizeof error;
    rc = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0 ? 0 : -1;
    if (error != 0) errno = error;
  }
  if (rc != 0) {
    std::fprintf(stderr, "fuzz_store: cannot connect to the store: %s\n", std::strerror(errno));
    std::exit(1);
  }
  // Closing resets the connection: no TIME_WAIT is left behind by the harness's side.
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  return fd;
}

// Sends everything while reading what comes back (the server answers while the client still
// sends); returns when all is sent or the server has closed. `in` collects what was read.
void send_all(int fd, const std::string& wire, std::string& in, bool& eof) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  size_t sent = 0;
  while (sent < wire.size() && !eof) {
    pollfd p{fd, POLLIN | POLLOUT, 0};
    if (::poll(&p, 1, 10'000) == 0) finding("the store neither reads nor answers for 10 s", sent, wire.size());
    if (p.revents & POLLIN) {
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0)
        in.append(buf, static_cast<size_t>(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR))
        eof = true;
    }
    if (!eof && (p.revents & POLLOUT)) {
      ssize_t n = ::send(fd, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
      if (n > 0)
        sent += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        return;  // reset by the server: it closed
    }
    if (p.revents & (POLLERR | POLLHUP)) eof = true;
  }
}

// Counts the well-formed answers at the front of `in`; a malformed one is a finding.
size_t count_answers(const std::string& in) {
  size_t at = 0, count = 0;
  while (in.size() - at >= 4) {
    const uint32_t length = le32(in.data() + at);
    if (length == 0 || length > kMaxFrameBytes) finding("an answer frame of impossible length", length, count);
    if (in.size() - at - 4 < length) break;
    if (static_cast<uint8_t>(in[at + 4]) > static_cast<uint8_t>(Status::Error))
      finding("an answer with an unknown status", static_cast<uint8_t>(in[at + 4]), count);
    ++count;
    at += 4 + length;
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  enter_private_network();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool preauth = (data[0] & 1) != 0;
  const bool half_close = (data[0] & 2) != 0;
  std::string wire = preauth ? Writer().u8(static_cast<uint8_t>(Op::Auth)).str(kToken).frame() : std::string();
  wire.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Expectation expect = walk(wire, false, half_close);

  ddl::launcher::StoreServer server({.token = kToken, .log = [](const std::string&) {}});
  const int fd = connect_to(server.port());
  std::string in;
  bool eof = false;
  send_all(fd, wire, in, eof);
  if (half_close && !eof) ::shutdown(fd, SHUT_WR);

  // Reads until the answers owed have come (and the close, when one is owed).
  size_t answers = count_answers(in);
  while (!eof && (answers < expect.answers || expect.closes)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) == 0) finding("no answer from the store for 10 s (answers so far, owed)", answers, expect.answers);
    char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0)
      in.append(buf, static_cast<size_t>(n));
    else if (n == 0 || (errno != EAGAIN && errno != EINTR))
      eof = true;
    answers = count_answers(in);
    if (answers > expect.answers) finding("more answers than requests (answers, owed)", answers, expect.answers);
  }
  if (answers != expect.answers) finding("answers differ from the requests (answers, owed)", answers, expect.answers);
  if (eof && !expect.closes) finding("the store closed a connection it had no reason to close", answers, expect.answers);
  ::close(fd);
  return 0;
}
