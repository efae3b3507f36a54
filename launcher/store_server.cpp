#include "launcher/store_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "rendezvous/store_protocol.hpp"

namespace ddl::launcher {

using Clock = std::chrono::steady_clock;
using namespace ddl::store;

namespace {

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown peer";
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return fmt::format("{}:{}", host, serv);
}

int listen_on_free_port(const std::string& host, uint16_t& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), "0", &hints, &res);
  if (gai != 0) throw Error(fmt::format("store: cannot resolve bind address '{}': {}", host, gai_strerror(gai)));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 65535) != 0) {
    int err = errno;
    ::freeaddrinfo(res);
    if (fd >= 0) ::close(fd);
    throw Error(fmt::format("store: cannot listen on {}: {}", host, std::strerror(err)));
  }
  ::freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace

class StoreServer::Loop {
 public:
  Loop(int listen_fd, StoreServerOptions options, std::shared_ptr<std::atomic<uint64_t>> rejected)
      : listen_fd_(listen_fd), options_(std::move(options)), rejected_(std::move(rejected)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epoll_fd_ < 0 || wake_fd_ < 0) throw Error(fmt::format("store: cannot create epoll: {}", std::strerror(errno)));
    watch(listen_fd_, kListenId, EPOLLIN);
    watch(wake_fd_, kWakeId, EPOLLIN);
  }

  ~Loop() {
    for (auto& [id, c] : conns_) ::close(c.fd);
    ::close(listen_fd_);
    ::close(wake_fd_);
    ::close(epoll_fd_);
  }

  void stop() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void run() {
    std::vector<epoll_event> events(1024);
    while (!stopping_) {
      int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), ms_until_next_deadline());
      if (n < 0 && errno != EINTR) {
        log(fmt::format("store: epoll_wait failed: {}", std::strerror(errno)));
        return;
      }
      for (int i = 0; i < n; ++i) dispatch(events[i]);
      if (Clock::now() >= next_deadline_) expire_deadlines();
      drain_pending_frames();
    }
  }

 private:
  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kWakeId = 1;

  struct Connection {
    int fd = -1;
    bool authenticated = false;
    Clock::time_point auth_deadline;
    std::string in;
    size_t in_handled = 0;  // bytes at the front of `in` already handled: dropped once per batch, not per request
    std::string out;
    // A pending Wait: how many of its keys are still missing, when it expires, and its sequence
    // number (stale entries in waiters_ carry an older one and are ignored).
    size_t missing = 0;
    Clock::time_point wait_deadline;
    uint64_t wait_seq = 0;
    std::vector<std::string> waited_keys;  // the keys of the pending Wait, in waiters_
    bool waiting = false;
    bool peer_done = false;  // the client shut down its sending side: answer what it sent, then close
  };

  void watch(int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }

  void log(const std::string& message) {
    if (options_.log) options_.log(message);
  }

  int ms_until_next_deadline() const {
    if (next_deadline_ == Clock::time_point::max()) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline_ - Clock::now()).count();
    return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms + 1, 1 << 30));
  }

  void note_deadline(Clock::time_point t) { next_deadline_ = std::min(next_deadline_, t); }

  void dispatch(const epoll_event& ev) {
    uint64_t id = ev.data.u64;
    if (id == kWakeId) {
      stopping_ = true;
      return;
    }
    if (id == kListenId) {
      accept_all();
      return;
    }
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    if (ev.events & (EPOLLERR | EPOLLHUP)) {
      close_connection(id);
      return;
    }
    if ((ev.events & EPOLLOUT) && !flush(id, c)) return;
    if (ev.events & EPOLLIN) read_from(id, c);
  }

  void accept_all() {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        const bool out_of_descriptors = errno == EMFILE || errno == ENFILE;
        if (out_of_descriptors && close_oldest_stranger()) continue;
        if (out_of_descriptors) {
          log_once(emfile_logged_, "store: out of file descriptors; new clients wait until one closes (raise `ulimit -n`)");
          // Stop watching the listener, or epoll reports it ready forever; a close re-arms it.
          set_events(listen_fd_, kListenId, 0);
          listen_paused_ = true;
        }
        return;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      uint64_t id = next_id_++;
      Connection& c = conns_[id];
      c.fd = fd;
      c.auth_deadline = Clock::now() + options_.auth_timeout;
      note_deadline(c.auth_deadline);
      unauthenticated_.insert(id);
      watch(fd, id, EPOLLIN);
    }
  }

  // Out of descriptors, a flood of strangers would keep a worker that connects now waiting until
  // their auth timeouts: instead the unauthenticated connection accepted first is closed. It gets a
  // last read, so that a client whose token is already in the kernel authenticates instead; a
  // worker sends its token as soon as it connects, so the oldest silent connection is a stranger's.
  // False when every connection is authenticated (nothing may be closed to make room).
  bool close_oldest_stranger() {
    while (!unauthenticated_.empty()) {
      const uint64_t id = *unauthenticated_.begin();
      read_from(id, conns_.at(id));  // may authenticate it, or reject or close it
      if (!conns_.count(id)) return true;
      if (!unauthenticated_.count(id)) continue;  // it was a worker after all
      log_once(evicted_logged_,
               "store: out of file descriptors; closing the oldest unauthenticated connections "
               "to make room (further ones are counted, not logged)");
      ++*rejected_;
      close_connection(id);
      return true;
    }
    return false;
  }

  void log_once(bool& logged, const std::string& message) {
    if (!logged) log(message);
    logged = true;
  }

  // Reads what the socket holds. An unauthenticated connection may buffer no more than one auth
  // frame (the rest stays in the kernel until it has authenticated, or is dropped with it): a client
  // without the token must not make the launcher hold memory.
  void read_from(uint64_t id, Connection& c) {
    char buf[65536];
    while (true) {
      size_t room = sizeof buf;
      if (!c.authenticated) {
        const size_t cap = 4 + kMaxAuthFrameBytes;
        if (unread(c).size() >= cap) break;
        room = std::min(room, cap - unread(c).size());
      }
      ssize_t n = ::recv(c.fd, buf, room, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {  // an error: nothing can be answered
        close_connection(id);
        return;
      }
      // End of stream: a client may send its requests and then shut down its side (a half-close);
      // it still reads, so answer every whole request first.
      c.peer_done = true;
      process_frames(id);
      close_when_answered(id);
      return;
    }
    process_frames(id);
    // Still unauthenticated with a full buffer: the frame claimed to be larger than an auth frame
    // may be (process_frames rejected it) or the connection is gone; nothing more to read here.
  }

  static std::string_view unread(const Connection& c) { return std::string_view(c.in).substr(c.in_handled); }

  // Handles every complete frame in the input buffer, in order; stops while a Wait is pending.
  // Handled frames leave the buffer together at the end: erasing each at once would move all that
  // follows it, making a client's burst of many small requests cost their number squared.
  void process_frames(uint64_t id) {
    while (true) {
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      Connection& c = it->second;
      auto length = c.waiting ? std::nullopt : peek_frame_length(unread(c));
      const uint32_t limit = c.authenticated ? kMaxFrameBytes : kMaxAuthFrameBytes;
      if (length && (*length == 0 || *length > limit)) {
        if (!c.authenticated)
          reject(id);
        else {
          log(fmt::format("store: closed {}: frame of {} bytes", peer_name(c.fd), *length));
          close_connection(id);
        }
        return;
      }
      if (!length || unread(c).size() < 4 + *length) {  // waiting, or no whole frame yet
        c.in.erase(0, c.in_handled);
        c.in_handled = 0;
        return;
      }
      std::string body(unread(c).substr(4, *length));
      c.in_handled += 4 + *length;
      if (!c.authenticated)
        authenticate(id, c, body);
      else
        handle_request(id, c, body);
    }
  }

  // A connection whose client has stopped sending closes once nothing is left to answer; until then
  // it is watched only for writability (at end of stream it would read as ready forever).
  void close_when_answered(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second.peer_done) return;
    Connection& c = it->second;
    if (!c.waiting && c.out.empty() && !has_whole_request(c))
      close_connection(id);
    else
      set_events(c.fd, id, c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  }

  // A request queued behind a pending Wait, still to be answered.
  static bool has_whole_request(const Connection& c) {
    auto length = peek_frame_length(unread(c));
    return length && unread(c).size() >= 4 + *length;
  }

  void reject(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // already closed
    uint64_t count = ++*rejected_;
    if (count == 1)
      log(
          fmt::format("store: rejected a connection from {}: wrong or missing DDL_STORE_TOKEN "
                      "(further rejections are counted, not logged)",
                      peer_name(it->second.fd)));
    close_connection(id);
  }

  void authenticate(uint64_t id, Connection& c, const std::string& body) {
    Reader r(body);
    auto op = r.u8();
    auto token = r.str();
    if (op != static_cast<uint8_t>(Op::Auth) || !token || !r.at_end() || !constant_time_equal(*token, options_.token)) {
      reject(id);
      return;
    }
    c.authenticated = true;
    unauthenticated_.erase(id);
    reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)));
  }

  void handle_request(uint64_t id, Connection& c, const std::string& body) {
    Reader r(body);
    auto op = r.u8();
    switch (op ? static_cast<Op>(*op) : Op{}) {
      case Op::Set: {
        auto key = r.str();
        auto value = r.str();
        if (!key || !value) return malformed(id, c);
        assign(*key, std::move(*value));
        return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)));
      }
      case Op::Get: {
        auto key = r.str();
        if (!key) return malformed(id, c);
        auto it = data_.find(*key);
        if (it == data_.end()) return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::NotFound)));
        return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)).str(it->second));
      }
      case Op::Add: {
        auto key = r.str();
        auto delta = r.i64();
        if (!key || !delta) return malformed(id, c);
        int64_t sum = *delta;
        if (auto it = data_.find(*key); it != data_.end()) {
          const std::string& held = it->second;
          int64_t current = 0;
          const auto [end, failure] = std::from_chars(held.data(), held.data() + held.size(), current);
          if (held.empty() || failure != std::errc() || end != held.data() + held.size())  // whole, in range
            return reply(id, c,
                         Writer().u8(static_cast<uint8_t>(Status::Error)).str(fmt::format("key '{}' does not hold an integer", *key)));
          if (__builtin_add_overflow(sum, static_cast<int64_t>(current), &sum))
            return reply(id, c,
                         Writer().u8(static_cast<uint8_t>(Status::Error)).str(fmt::format("add to key '{}' overflows 64 bits", *key)));
        }
        assign(*key, std::to_string(sum));
        return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)).i64(sum));
      }
      case Op::Wait: return begin_wait(id, c, r);
      case Op::Delete: {
        auto key = r.str();
        if (!key) return malformed(id, c);
        int64_t erased = static_cast<int64_t>(data_.erase(*key));
        return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)).i64(erased));
      }
      default: return malformed(id, c);
    }
  }

  void malformed(uint64_t id, Connection& c) { reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Error)).str("malformed request")); }

  void begin_wait(uint64_t id, Connection& c, Reader& r) {
    auto count = r.u32();
    if (!count) return malformed(id, c);
    std::vector<std::string> missing;
    for (uint32_t i = 0; i < *count; ++i) {
      auto key = r.str();
      if (!key) return malformed(id, c);
      if (!data_.count(*key)) missing.push_back(std::move(*key));
    }
    auto timeout_ms = r.i64();
    if (!timeout_ms) return malformed(id, c);
    if (missing.empty()) return reply(id, c, Writer().u8(static_cast<uint8_t>(Status::Ok)));
    c.waiting = true;
    c.missing = missing.size();
    c.wait_seq = next_wait_seq_++;
    // Clamped to a year, so that no timeout a client sends can overflow the clock.
    constexpr int64_t kLongestWaitMs = 365LL * 24 * 3600 * 1000;
    c.wait_deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(*timeout_ms, 0, kLongestWaitMs));
    note_deadline(c.wait_deadline);
    for (auto& key : missing) waiters_[key].push_back({id, c.wait_seq});
    c.waited_keys = std::move(missing);
  }

  // Drops a wait's entries from waiters_ when it ends before its keys are all set (it timed out, or
  // its connection closed): keys nobody sets would otherwise keep them for the whole run.
  void forget_wait(uint64_t id, Connection& c) {
    for (const auto& key : c.waited_keys) {
      auto it = waiters_.find(key);
      if (it == waiters_.end()) continue;
      std::erase_if(it->second, [&](const auto& waiter) { return waiter.first == id; });
      if (it->second.empty()) waiters_.erase(it);
    }
    c.waited_keys.clear();
  }

  // Stores a value and completes the waits that were waiting only for this key.
  void assign(const std::string& key, std::string value) {
    bool created = data_.insert_or_assign(key, std::move(value)).second;
    if (!created) return;
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    auto waiting = std::move(it->second);
    waiters_.erase(it);
    for (auto [conn_id, seq] : waiting) {
      auto cit = conns_.find(conn_id);
      if (cit == conns_.end() || !cit->second.waiting || cit->second.wait_seq != seq) continue;
      if (--cit->second.missing == 0) finish_wait(conn_id, cit->second, Status::Ok);
    }
  }

  void finish_wait(uint64_t id, Connection& c, Status status) {
    forget_wait(id, c);
    c.waiting = false;
    reply(id, c, Writer().u8(static_cast<uint8_t>(status)));
    // Requests that arrived behind the wait (a client that pipelines) can run now.
    if (auto it = conns_.find(id); it != conns_.end() && !unread(it->second).empty()) pending_frames_.push_back(id);
  }

  // Collects what expired first, then acts on it: answering a wait may close its connection (the
  // client reset it), which must not happen while iterating over the connections.
  void expire_deadlines() {
    const auto now = Clock::now();
    next_deadline_ = Clock::time_point::max();
    std::vector<uint64_t> silent, timed_out;
    for (auto& [id, c] : conns_) {
      if (!c.authenticated) {
        if (now >= c.auth_deadline)
          silent.push_back(id);
        else
          note_deadline(c.auth_deadline);
      } else if (c.waiting) {
        if (now >= c.wait_deadline)
          timed_out.push_back(id);
        else
          note_deadline(c.wait_deadline);
      }
    }
    for (uint64_t id : timed_out)
      if (auto it = conns_.find(id); it != conns_.end()) finish_wait(id, it->second, Status::Timeout);
    for (uint64_t id : silent) reject(id);
  }

  void drain_pending_frames() {
    auto pending = std::move(pending_frames_);
    pending_frames_.clear();
    for (uint64_t id : pending) {
      process_frames(id);
      close_when_answered(id);
    }
  }

  void reply(uint64_t id, Connection& c, const Writer& w) {
    c.out += w.frame();
    flush(id, c);
  }

  // Writes what is buffered; watches for writability while some remains. False if closed.
  bool flush(uint64_t id, Connection& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        set_events(c.fd, id, c.peer_done ? static_cast<uint32_t>(EPOLLOUT) : static_cast<uint32_t>(EPOLLIN | EPOLLOUT));
        return true;
      }
      close_connection(id);
      return false;
    }
    if (c.peer_done && !c.waiting && !has_whole_request(c)) {  // all answered
      close_connection(id);
      return false;
    }
    set_events(c.fd, id, c.peer_done ? 0u : static_cast<uint32_t>(EPOLLIN));
    return true;
  }

  void set_events(int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }

  void close_connection(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    forget_wait(id, it->second);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
    ::close(it->second.fd);
    conns_.erase(it);
    unauthenticated_.erase(id);
    if (listen_paused_) {
      listen_paused_ = false;
      set_events(listen_fd_, kListenId, EPOLLIN);
    }
  }

  int listen_fd_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  bool stopping_ = false;
  bool emfile_logged_ = false;
  bool evicted_logged_ = false;
  bool listen_paused_ = false;  // out of descriptors: accepting resumes when a connection closes
  StoreServerOptions options_;
  std::shared_ptr<std::atomic<uint64_t>> rejected_;
  uint64_t next_id_ = 2;
  uint64_t next_wait_seq_ = 1;
  Clock::time_point next_deadline_ = Clock::time_point::max();
  std::unordered_map<uint64_t, Connection> conns_;
  std::set<uint64_t> unauthenticated_;  // ids grow with each accept: begin() is the oldest
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> waiters_;
  std::vector<uint64_t> pending_frames_;
};

StoreServer::StoreServer(StoreServerOptions options) : rejected_(std::make_shared<std::atomic<uint64_t>>(0)) {
  int fd = listen_on_free_port(options.bind_host, port_);
  loop_ = std::make_unique<Loop>(fd, std::move(options), rejected_);
  thread_ = std::thread([this] { loop_->run(); });
}

StoreServer::~StoreServer() {
  loop_->stop();
  thread_.join();
}

}  // namespace ddl::launcher
