// Where the workers' output goes while a supervisor runs them: each stdout and stderr pipe is read
// as it fills, its lines are shown on ddl's own stdout and stderr (prefixed with the rank, only the
// ranks --ranks shows, or labelled for a launching host to relay), copied to --output-dir files,
// and stderr's last lines kept for the failure summary. ddl's own output is written as its reader
// takes it (PendingOutput): a reader that stops reading holds up the workers' output, never ddl.
#pragma once

#include <poll.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/launch_layout.hpp"
#include "launcher/pending_output.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/terminal_lines.hpp"

namespace ddl::launcher {

class OutputRouter {
 public:
  // What the output tells the supervisor: that the workers are active (a hang watchdog's business),
  // and the stacks a task launcher's lines relay.
  struct Listener {
    std::function<void()> activity;
    std::function<void(const backends::TaskLine&)> relayed_stack;
    std::function<void(const backends::TaskLine&)> relayed_end;  // a rank's program ended, its task with 0
  };

  OutputRouter(const SupervisorOptions& options, Listener listener);
  ~OutputRouter();  // closes the pipes and files still open
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  // Each launch's (stdout, stderr) files under --output-dir, or (-1, -1): made before any worker
  // starts, so that a folder or file that cannot be written stops the run before it runs anything.
  // Each pair is given back to add_worker, whose streams then own them. Throws an Error naming the file.
  // A file a previous run wrote keeps its text until empty_previous_output: a run that fails to
  // start (out of open files, a program that cannot start) leaves the last run's output as it was.
  std::vector<std::pair<int, int>> open_output_files(const std::vector<WorkerLaunch>& launches);

  // Empties `files` (from open_output_files; not when appending), once every worker has started
  // and before anything of theirs is written.
  void empty_previous_output(const std::vector<std::pair<int, int>>& files) const;

  // Routes a started launch's pipes: `files` from open_output_files, `stderr_tail` (kept alive by the
  // caller) gets the last lines of stderr, `labeller` reads a task launcher's lines (or nullptr).
  void add_worker(const WorkerLaunch& launch, int stdout_fd, int stderr_fd, std::pair<int, int> files, std::deque<std::string>* stderr_tail,
                  const LineLabeller* labeller);

  // For the supervisor's poll: the descriptor of ddl's output that waits to be written (POLLOUT),
  // and the open pipes, appended to `fds` (none while too much output waits for ddl's reader).
  int pending_fd() const { return output_.next_fd(); }
  void add_open_pipes(std::vector<pollfd>& fds);
  // Reads the pipes of `fds[first..]` that poll found ready (those add_open_pipes added); whether any.
  bool read_ready_pipes(const std::vector<pollfd>& fds, size_t first);
  // Writes what ddl's reader takes now (pending_fd was ready).
  void write_pending();
  bool any_pipe_open() const;
  bool output_full() const { return output_.full(); }
  // ddl's stdout or stderr is a pipe whose reader went away (`ddl run ... | head -1`).
  bool reader_gone() const { return reader_gone_; }
  bool output_empty() const { return output_.empty(); }

  // A worker's unfinished line that has waited kUnfinishedLineQuietTime is shown; the earliest time
  // one is due, if one waits.
  void show_quiet_unfinished_lines();
  std::optional<std::chrono::steady_clock::time_point> next_unfinished_due() const;

  // ddl's own words on its stdout or stderr, after the workers' pending output.
  void add(int fd, const std::string& text) { output_.add(fd, text); }
  // ddl's own report on stderr, on a line of its own.
  void report(const std::string& text);

  // At the end: what each pipe still holds (a last line without its end) goes out, they close, and a
  // line left open on ddl's output is ended before ddl's own words.
  void end_all_pipes();
  void end_open_lines();
  // A signal ended the wait for ddl's reader: the pipes close and what waited is dropped.
  void give_up();

  // Whether a task launcher's relay named the host of `rank` (each rank's does first thing).
  bool knows_host_of(int rank) const { return hosts_of_ranks_.count(rank) != 0; }
  // The host a task launcher's relay named for `rank`, or `otherwise`.
  std::string host_of(int rank, const std::string& otherwise) const {
    auto it = hosts_of_ranks_.find(rank);
    return it == hosts_of_ranks_.end() ? otherwise : it->second;
  }

 private:
  struct Stream;
  using Clock = std::chrono::steady_clock;

  void read_stream(Stream& s);
  void end_stream(Stream& s);
  template <typename Split>
  void emit(Stream& s, Split split);
  bool emit_labelled(Stream& s, std::string_view line, char end, std::string& to_terminal);
  std::string shown(Stream& s, std::string_view text, char end);
  bool shows(int rank) const;
  std::string line_prefix(int rank, const std::string& host) const;
  void write_output_file(int& fd, int rank, const char* suffix, std::string_view text);
  void write_rank_file(int rank, const char* suffix, const std::string& text);
  int open_rank_file_late(int rank, const char* suffix);  // -1, warned, when it cannot be opened
  void stop_reading_into_closed_pipe(int target_fd);
  void warn_output_lost(int fd, int error);

  const SupervisorOptions& options_;
  Listener listener_;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool reader_gone_ = false;
  std::vector<Stream*> polled_;  // the streams add_open_pipes added, in order
  PendingOutput output_;
  TerminalLines stdout_lines_;                             // what ddl's stdout shows
  TerminalLines stderr_lines_;                             // what ddl's stderr shows, when it is not where stdout goes
  TerminalLines* stderr_terminal_;                         // stderr_lines_, or stdout_lines_ when both go to one file
  std::map<std::pair<int, std::string>, int> rank_files_;  // a task launcher's per-rank output files
  std::map<int, std::string> hosts_of_ranks_;              // a task launcher's ranks: where each runs, as its relay said
};

}  // namespace ddl::launcher
