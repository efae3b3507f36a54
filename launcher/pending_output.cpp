#include "launcher/pending_output.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string>

namespace ddl::launcher {

namespace {

// Text for one descriptor is joined into pieces up to this size: fewer, larger writes, and a piece
// being written is not grown without end while its reader keeps up only partly.
constexpr size_t kLargestPiece = 1 << 20;

// Without a descriptor of its own (a socket), poll()'s POLLOUT promises room for PIPE_BUF bytes
// only: write_next() writes that many at a time, up to this many times while the descriptor
// still takes more.
constexpr int kMostBlockingWritesAtOnce = 16;

bool writable_now(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) != 0;
}

// A new open file description for what `fd` writes to (a pipe, a terminal) made non-blocking:
// O_NONBLOCK on `fd` itself would be shared with the shell and whatever else holds it. -1 where
// that cannot be opened (a socket, no /proc).
int own_non_blocking_descriptor(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  return ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
}

}  // namespace

PendingOutput::~PendingOutput() {
  for (auto& [fd, to] : targets_)
    if (to.own_fd >= 0) ::close(to.own_fd);
}

PendingOutput::Target& PendingOutput::target(int fd) {
  auto known = targets_.find(fd);
  if (known != targets_.end()) return known->second;
  Target to;
  struct stat st {};
  to.regular_file = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);  // reopened, it would lose the shared offset
  if (!to.regular_file && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) to.own_fd = own_non_blocking_descriptor(fd);
  return targets_.emplace(fd, to).first->second;
}

void PendingOutput::add(int fd, std::string_view data) {
  if (data.empty() || target(fd).reader_gone) return;
  bytes_ += data.size();
  Piece* last = pieces_.empty() ? nullptr : &pieces_.back();
  if (last != nullptr && last->fd == fd && last->bytes.size() + data.size() <= kLargestPiece) {
    last->bytes.append(data);
    return;
  }
  pieces_.push_back({fd, std::string(data)});
}

int PendingOutput::write_next() {
  for (int write = 0; write < kMostBlockingWritesAtOnce && !pieces_.empty(); ++write) {
    const int fd = pieces_.front().fd;
    Target& to = target(fd);
    if (write > 0 && to.own_fd < 0 && !to.regular_file && !writable_now(fd)) return -1;
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
  const bool may_wait = to.own_fd < 0 && !to.regular_file;
  const ssize_t n = ::write(to.own_fd >= 0 ? to.own_fd : piece.fd, piece.bytes.data() + piece.written,
                            may_wait ? std::min<size_t>(left, PIPE_BUF) : left);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return Written::nothing_now;
  if (n < 0 && errno == EPIPE) return Written::reader_gone;
  if (n <= 0) {  // an error other than a gone reader: this piece is lost, the next may fare better
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

void PendingOutput::clear() {
  pieces_.clear();
  bytes_ = 0;
}

}  // namespace ddl::launcher
