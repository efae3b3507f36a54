// What ddl still has to write to its stdout and stderr, in the order it has to go out. A reader
// that does not read (a paused pager, `ddl run ... | sleep 600`) must not keep the supervisor
// from acting on signals and failed workers, so it writes only what a descriptor takes without
// waiting, when poll() says it takes more; while too much waits, the supervisor stops reading
// the workers, whose own writes then wait as they would without ddl.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ddl::launcher {

// What may wait before the workers' output is no longer read: many pipes' worth, so that a
// reader that is only slow (a terminal over ssh) costs the workers nothing.
inline constexpr size_t kMostPendingOutputBytes = 4 << 20;

// Writes what `fd` takes of `text` now, without waiting for its reader (ddl's last words once a
// signal has ended its wait for a reader that stopped reading); the rest is dropped.
void write_without_waiting(int fd, std::string_view text);

class PendingOutput {
 public:
  explicit PendingOutput(size_t most_bytes = kMostPendingOutputBytes) : most_bytes_(most_bytes) {}
  ~PendingOutput();
  PendingOutput(const PendingOutput&) = delete;
  PendingOutput& operator=(const PendingOutput&) = delete;

  // Queues `data` for `fd`; dropped once that descriptor's reader is gone, or where it cannot be
  // written at all.
  void add(int fd, std::string_view data);

  bool empty() const { return pieces_.empty(); }
  // Reading more would only make it grow: the workers' output is left in their pipes meanwhile.
  bool full() const { return bytes_ >= most_bytes_; }
  size_t bytes() const { return bytes_; }
  // The descriptor the next bytes go to (to poll for POLLOUT); -1 when nothing waits.
  int next_fd() const { return pieces_.empty() ? -1 : pieces_.front().fd; }

  // Writes, in order, what the descriptors take now, without waiting: at once, and again when
  // poll() says POLLOUT (or an error) for next_fd(). A piece that cannot be written (a full disk, a terminal that has gone) is dropped,
  // as a blocking write would lose it. Returns the descriptor whose reader has gone (EPIPE), whose output is all dropped from then on; -1
  // otherwise.
  int write_next();

  // Drops everything pending.
  void clear();

  // A descriptor whose write failed (other than for a gone reader: a full disk, /dev/full) and the
  // errno, once per descriptor, for a warning; nullopt when there is no new one.
  std::optional<std::pair<int, int>> take_write_failure();

 private:
  struct Piece {
    int fd = -1;
    std::string bytes;
    size_t written = 0;
  };

  // How ddl writes to one of its descriptors.
  struct Target {
    int own_fd = -1;            // a non-blocking descriptor of ddl's own onto the same pipe or terminal, or -1
    bool regular_file = false;  // a file's write never waits for a reader
    bool reader_gone = false;
    bool unwritable = false;    // not open for writing (a read end as stdout)
    bool write_failed = false;  // a write has failed: told once
  };

  enum class Written { some, nothing_now, reader_gone };

  Target& target(int fd);
  Written write_once(Target& to);
  void drop_everything_for(int fd);

  std::deque<Piece> pieces_;
  size_t bytes_ = 0;
  size_t most_bytes_;
  std::map<int, Target> targets_;
  std::optional<std::pair<int, int>> new_write_failure_;
};

}  // namespace ddl::launcher
