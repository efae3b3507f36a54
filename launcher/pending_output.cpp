#include "launcher/pending_output.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

namespace ddl::launcher {

namespace {

// Text for one descriptor is joined into pieces up to this size: fewer, larger writes, and a piece
// being written is not grown without end while its reader keeps up only partly.
constexpr size_t kLargestPiece = 1 << 20;

// The most writes on one call of write_next().
constexpr int kMostWritesAtOnce = 16;

// The longest a write to a descriptor ddl could not open for itself (a socket; a terminal of
// another user, under sudo -u) may wait: POLLOUT there promises room for some bytes, not for all.
constexpr std::chrono::milliseconds kLongestWriteWait{20};

// Whether a write to `fd` would not wait: it takes more, or it would fail at once (its reader gone).
bool writable_now(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && p.revents != 0;
}

bool open_for_writing(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_ACCMODE) != O_RDONLY;
}

// Whether ddl may open what `fd` (open for writing) writes to once more, for a description of its
// own: a pipe, or a terminal (a pty's master side excepted: opening /dev/ptmx makes a new pty).
bool may_reopen(int fd, const struct stat& st) {
  if (S_ISFIFO(st.st_mode)) return true;
  const bool pty_master = ::major(st.st_rdev) == 5 && ::minor(st.st_rdev) == 2;  // /dev/ptmx's
  return S_ISCHR(st.st_mode) && ::isatty(fd) == 1 && !pty_master;
}

// A new open file description for what `fd` writes to, made non-blocking: O_NONBLOCK on `fd`
// itself would be shared with the shell and whatever else holds it. -1 where that cannot be
// opened (no /proc; another user's terminal).
int own_non_blocking_descriptor(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  return ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
}

void interrupt_only(int) {}

// The signal that cuts a write short (see write_waiting_at_most): handled, without SA_RESTART, so
// that a write it interrupts returns what it wrote, or EINTR.
int write_timer_signal() {
  static const int sig = [] {
    const int s = SIGRTMIN + 1;
    struct sigaction action {};
    action.sa_handler = interrupt_only;
    sigemptyset(&action.sa_mask);
    ::sigaction(s, &action, nullptr);
    return s;
  }();
  return sig;
}

// A blocking write that gives up after `limit`: a timer's signal to this thread interrupts it.
ssize_t write_waiting_at_most(int fd, const char* data, size_t size, std::chrono::milliseconds limit) {
  sigevent event{};
  event.sigev_notify = SIGEV_THREAD_ID;
  event.sigev_signo = write_timer_signal();
  event._sigev_un._tid = ::gettid();  // sigev_notify_thread_id, which glibc 2.36 does not name
  timer_t timer{};
  if (::timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) return -1;
  itimerspec due{};
  due.it_value.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
  ::timer_settime(timer, 0, &due, nullptr);
  const ssize_t n = ::write(fd, data, size);
  const int write_errno = errno;
  ::timer_delete(timer);  // a signal already sent is handled as this returns, doing nothing
  errno = write_errno;
  return n;
}

}  // namespace

void write_without_waiting(int fd, std::string_view text) {
  PendingOutput output;
  output.add(fd, text);
  output.write_next();
}

PendingOutput::~PendingOutput() {
  for (auto& [fd, to] : targets_)
    if (to.own_fd >= 0) ::close(to.own_fd);
}

PendingOutput::Target& PendingOutput::target(int fd) {
  auto known = targets_.find(fd);
  if (known != targets_.end()) return known->second;
  Target to;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !open_for_writing(fd)) {
    to.unwritable = true;  // every write would fail (EBADF): what comes for it is dropped, as it would be
  } else {
    to.regular_file = S_ISREG(st.st_mode);  // never waits; reopened, it would lose the shared offset
    if (may_reopen(fd, st)) to.own_fd = own_non_blocking_descriptor(fd);
  }
  return targets_.emplace(fd, to).first->second;
}

void PendingOutput::add(int fd, std::string_view data) {
  const Target& to = target(fd);
  if (data.empty() || to.reader_gone || to.unwritable) return;
  bytes_ += data.size();
  Piece* last = pieces_.empty() ? nullptr : &pieces_.back();
  if (last != nullptr && last->fd == fd && last->bytes.size() + data.size() <= kLargestPiece) {
    last->bytes.append(data);
    return;
  }
  pieces_.push_back({fd, std::string(data)});
}

int PendingOutput::write_next() {
  for (int write = 0; write < kMostWritesAtOnce && !pieces_.empty(); ++write) {
    const int fd = pieces_.front().fd;
    Target& to = target(fd);
    if (to.own_fd < 0 && !to.regular_file && !writable_now(fd)) return -1;  // it takes nothing now
    switch (write_once(to)) {
      case Written::some: continue;
      case Written::nothing_now: return -1;
      case Written::reader_gone: drop_everything_for(fd); return fd;
    }
  }
  return -1;
}

PendingOutput::Written PendingOutput::write_once(Target& to) {
  Piece& piece = pieces_.front();
  const size_t left = piece.bytes.size() - piece.written;
  const char* data = piece.bytes.data() + piece.written;
  const ssize_t n = to.own_fd >= 0    ? ::write(to.own_fd, data, left)
                    : to.regular_file ? ::write(piece.fd, data, left)
                                      : write_waiting_at_most(piece.fd, data, left, kLongestWriteWait);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return Written::nothing_now;  // EAGAIN: a descriptor ddl was given non-blocking
  if (n < 0 && errno == EPIPE) return Written::reader_gone;
  if (n <= 0) {  // an error other than a gone reader: this piece is lost, the next may fare better
    if (!to.write_failed && !new_write_failure_) new_write_failure_ = std::make_pair(piece.fd, n < 0 ? errno : EIO);
    to.write_failed = true;
    bytes_ -= left;
    pieces_.pop_front();
    return Written::some;
  }
  piece.written += static_cast<size_t>(n);
  bytes_ -= static_cast<size_t>(n);
  if (piece.written == piece.bytes.size()) pieces_.pop_front();
  return Written::some;
}

void PendingOutput::drop_everything_for(int fd) {
  target(fd).reader_gone = true;
  for (auto it = pieces_.begin(); it != pieces_.end();) {
    if (it->fd != fd) {
      ++it;
      continue;
    }
    bytes_ -= it->bytes.size() - it->written;
    it = pieces_.erase(it);
  }
}

std::optional<std::pair<int, int>> PendingOutput::take_write_failure() { return std::exchange(new_write_failure_, std::nullopt); }

void PendingOutput::clear() {
  pieces_.clear();
  bytes_ = 0;
}

}  // namespace ddl::launcher
