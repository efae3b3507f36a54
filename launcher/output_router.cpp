#include "launcher/output_router.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/write_all.hpp"
#include "launcher/line_splitter.hpp"
#include "launcher/relayed_output.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

// The rank of a task launcher's own lines.
constexpr int kLaunchersOwnLine = -1;

// An earlier start's file (a restart, a requeue) whose last line was cut off by its end: the next
// start's first line begins on a line of its own, not run into it.
void end_unfinished_line(int fd, const std::string& path) {
  const int reader = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (reader < 0) return;
  char last = '\n';
  const off_t size = ::lseek(reader, 0, SEEK_END);
  if (size > 0 && ::pread(reader, &last, 1, size - 1) == 1 && last != '\n') (void)!::write(fd, "\n", 1);
  ::close(reader);
}

// Opens rank `rank`'s file of `stream`: appended to with `append`, else emptied, unless `keep_for_now`
// (OutputRouter::empty_previous_output empties it once every worker has started).
int open_output_file(const std::string& dir, int rank, const char* stream, bool append, bool keep_for_now = false) {
  std::string path = fmt::format("{}/rank.{}.{}", dir, rank, stream);
  const int how = append ? O_APPEND : keep_for_now ? 0 : O_TRUNC;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | how | O_CLOEXEC, 0644);
  if (fd >= 0 && append) end_unfinished_line(fd, path);
  if (fd >= 0) return fd;
  if (errno == EMFILE || errno == ENFILE) throw open_failure(fmt::format("--output-dir: cannot write {}", path), errno);
  throw Error(fmt::format("--output-dir: cannot write {}: {}", path, std::strerror(errno)), "choose a directory you can write to");
}

bool is_regular_file(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

// Whether two descriptors write to the same file (stdout and stderr on one terminal).
bool same_file(int fd1, int fd2) {
  struct stat a {};
  struct stat b {};
  return ::fstat(fd1, &a) == 0 && ::fstat(fd2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void append_with_end(std::string& to, std::string_view text, char end) {
  to.append(text);
  if (end != LineSplitter::kNoEnd) to.push_back(end);
}

}  // namespace

// The most of one stderr line the failure summary repeats.
constexpr size_t kLongestSummaryLine = 4096;

// One worker output stream (stdout or stderr) on its way to ddl's own.
struct OutputRouter::Stream {
  int index = 0;                      // in the run's streams: with the rank, the source of its text on the output
  int rank = 0;                       // the worker's (a task launcher's lines say each their own)
  int fd = -1;                        // read end of the worker's pipe; -1 once at end of stream
  int target_fd = -1;                 // ddl's stdout or stderr
  TerminalLines* terminal = nullptr;  // what target_fd shows
  int file_fd = -1;                   // --output-dir copy, or -1
  std::string prefix;                 // "[rank] " or empty
  LineSplitter splitter;
  std::optional<Clock::time_point> unfinished_due;  // when its unfinished line is shown, if one waits
  std::deque<std::string>* tail = nullptr;          // stderr only: the last lines, for the summary
  std::string tail_line;                            // the line being put together for the tail
  const LineLabeller* labeller = nullptr;           // a task launcher's stream: lines carry task ranks
  const char* file_suffix = "";                     // "out" or "err", for per-rank files of a launcher

  // Whole lines of stderr, for the failure summary; a progress bar's redraws are not lines to remember.
  // Each kept to its first kLongestSummaryLine bytes: a worker's endless line is not ddl's memory.
  void remember_for_summary(std::string_view text, char end) {
    if (tail == nullptr) return;
    if (tail_line.size() <= kLongestSummaryLine) {
      const size_t room = kLongestSummaryLine - tail_line.size();
      tail_line.append(text.substr(0, room));
      if (text.size() > room) tail_line += " [...]";  // more than fits: cut (and nothing more is added)
    }
    if (end == LineSplitter::kNoEnd) return;
    if (end == '\n') {
      tail->push_back(std::move(tail_line));
      if (tail->size() > (labeller ? kLauncherStderrTailLines : kStderrTailLines)) tail->pop_front();
    }
    tail_line.clear();
  }
};

OutputRouter::OutputRouter(const SupervisorOptions& options, Listener listener)
    : options_(options),
      listener_(std::move(listener)),
      stderr_terminal_(same_file(STDOUT_FILENO, STDERR_FILENO) ? &stdout_lines_ : &stderr_lines_) {}

OutputRouter::~OutputRouter() {
  for (auto& [key, fd] : rank_files_)
    if (fd >= 0) ::close(fd);
  for (auto& s : streams_) {
    if (s->fd >= 0) ::close(s->fd);
    if (s->file_fd >= 0) ::close(s->file_fd);
  }
}

std::vector<std::pair<int, int>> OutputRouter::open_output_files(const std::vector<WorkerLaunch>& launches) {
  if (!options_.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.output_dir, ec);
    if (ec)
      throw Error(fmt::format("--output-dir: cannot create {}: {}", options_.output_dir, ec.message()),
                  "choose a directory you can write to");
  }
  std::vector<std::pair<int, int>> files;
  try {
    for (const auto& launch : launches) {
      auto& [out, err] = files.emplace_back(-1, -1);
      if (options_.output_dir.empty() || launch.labeller || options_.relay_with_rank_labels) continue;
      out = open_output_file(options_.output_dir, launch.rank, "out", options_.append_output, true);
      err = open_output_file(options_.output_dir, launch.rank, "err", options_.append_output, true);
    }
  } catch (...) {
    for (auto [out, err] : files)
      for (int fd : {out, err})
        if (fd >= 0) ::close(fd);
    throw;
  }
  return files;
}

void OutputRouter::empty_previous_output(const std::vector<std::pair<int, int>>& files) const {
  if (options_.append_output) return;
  for (auto [out, err] : files)
    for (int fd : {out, err})
      if (fd >= 0 && is_regular_file(fd) && ::ftruncate(fd, 0) != 0)  // (a device or FIFO has nothing to empty)
        throw Error(fmt::format("--output-dir: cannot empty a rank's file in {}: {}", options_.output_dir, std::strerror(errno)),
                    "choose a directory you can write to");
}

void OutputRouter::add_worker(const WorkerLaunch& launch, int stdout_fd, int stderr_fd, std::pair<int, int> files,
                              std::deque<std::string>* stderr_tail, const LineLabeller* labeller) {
  const std::string prefix = line_prefix(launch.rank, options_.host);
  const size_t longest_piece = options_.relay_with_rank_labels ? kLongestRelayedText : LineSplitter::kLongestLine;
  for (bool is_stdout : {true, false}) {
    Stream& s = *streams_.emplace_back(std::make_unique<Stream>());
    s.splitter = LineSplitter(longest_piece);
    s.index = static_cast<int>(streams_.size()) - 1;
    s.rank = launch.rank;
    s.fd = is_stdout ? stdout_fd : stderr_fd;
    s.target_fd = is_stdout ? STDOUT_FILENO : STDERR_FILENO;
    s.terminal = is_stdout ? &stdout_lines_ : stderr_terminal_;
    s.file_fd = is_stdout ? files.first : files.second;
    s.prefix = prefix;
    s.tail = is_stdout ? nullptr : stderr_tail;
    s.labeller = labeller;
    s.file_suffix = is_stdout ? "out" : "err";
  }
  if (options_.relay_with_rank_labels) {  // the launching host's --prefix host needs it
    output_.add(STDOUT_FILENO, relayed_host(launch.rank, options_.host));
    output_.add(STDERR_FILENO, relayed_host(launch.rank, options_.host));
  }
}

void OutputRouter::add_open_pipes(std::vector<pollfd>& fds) {
  polled_.clear();
  if (output_.full()) return;
  for (auto& s : streams_) {
    if (s->fd < 0) continue;
    fds.push_back({s->fd, POLLIN, 0});
    polled_.push_back(s.get());
  }
}

bool OutputRouter::read_ready_pipes(const std::vector<pollfd>& fds, size_t first) {
  bool read_any = false;
  for (size_t i = first; i < fds.size() && i - first < polled_.size(); ++i) {
    if (fds[i].revents == 0) continue;
    read_stream(*polled_[i - first]);
    read_any = true;
  }
  return read_any;
}

bool OutputRouter::any_pipe_open() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const auto& s) { return s->fd >= 0; });
}

void OutputRouter::write_pending() {
  const int reader_gone = output_.write_next();
  if (reader_gone >= 0) stop_reading_into_closed_pipe(reader_gone);
  if (auto failed = output_.take_write_failure()) warn_output_lost(failed->first, failed->second);
}

// ddl's stdout (or stderr) cannot be written (a full disk, /dev/full): said once, on the other
// one; the run goes on, and what cannot be written is lost, as a shell's commands would lose it.
void OutputRouter::warn_output_lost(int fd, int error) {
  const int other = fd == STDERR_FILENO ? STDOUT_FILENO : STDERR_FILENO;
  output_.add(other, fmt::format("ddl: warning: cannot write standard {}: {}; the workers' output to it is lost\n",
                                 fd == STDERR_FILENO ? "error" : "output", std::strerror(error)));
}

std::optional<std::chrono::steady_clock::time_point> OutputRouter::next_unfinished_due() const {
  std::optional<Clock::time_point> next;
  for (const auto& s : streams_)
    if (s->unfinished_due && (!next || *s->unfinished_due < *next)) next = s->unfinished_due;
  return next;
}

void OutputRouter::report(const std::string& text) {
  output_.add(STDERR_FILENO, stderr_terminal_->end_open_line());
  output_.add(STDERR_FILENO, text);
}

// Reads what is there now; the lines it completes go out in one write each way. An unfinished
// line left waiting is shown kUnfinishedLineQuietTime after it began to wait; a task
// launcher's is not (its label starts the line: the rest of the line is needed to read it).
void OutputRouter::read_stream(Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // An unfinished line waits kUnfinishedLineQuietTime at most: progress dots written every 50 ms
  // show as they come, not all at the line's end.
  std::optional<Clock::time_point> waiting_since = s.unfinished_due;
  s.unfinished_due.reset();
  if (n <= 0) {
    end_stream(s);
    return;
  }
  if (s.labeller == nullptr) listener_.activity();  // a task launcher's lines say what they are (emit_labelled)
  // The --output-dir file gets the bytes as the worker wrote them (carriage returns, a last line
  // without its end, binary); only the terminal view is made of lines.
  write_output_file(s.file_fd, s.rank, s.file_suffix, std::string_view(buf, static_cast<size_t>(n)));
  if (std::memchr(buf, '\n', static_cast<size_t>(n)) != nullptr) waiting_since.reset();  // a line ended: the next waits afresh
  emit(s, [&](auto sink) { s.splitter.feed(std::string_view(buf, static_cast<size_t>(n)), sink); });
  if (s.labeller == nullptr && s.splitter.has_unpassed_text())
    s.unfinished_due = waiting_since.value_or(Clock::now() + kUnfinishedLineQuietTime);
}

// The stream's end: what it still holds (a last line without its end) goes out, and it closes.
void OutputRouter::end_stream(Stream& s) {
  emit(s, [&](auto sink) { s.splitter.finish(sink); });
  if (s.fd >= 0) ::close(s.fd);  // emit may have closed it (its reader gone)
  s.fd = -1;
}

void OutputRouter::end_all_pipes() {
  for (auto& s : streams_)
    if (s->fd >= 0) end_stream(*s);
}

void OutputRouter::show_quiet_unfinished_lines() {
  const auto now = Clock::now();
  for (auto& s : streams_) {
    if (!s->unfinished_due || now < *s->unfinished_due) continue;
    s->unfinished_due.reset();
    emit(*s, [&](auto sink) { s->splitter.pass_unfinished(sink); });
  }
}

// Sends what the splitter passes: `text` and its `end` ('\n', '\r', or LineSplitter::kNoEnd).
template <typename Split>
void OutputRouter::emit(Stream& s, Split split) {
  std::string to_terminal;
  split([&](std::string_view text, char end) {
    if (s.labeller != nullptr) {
      // A relayed redraw is a whole line here: kept, a progress bar would push the lines that
      // explain a failure out of the tail.
      if (emit_labelled(s, text, end, to_terminal)) s.remember_for_summary(text, end);
      return;
    }
    to_terminal.append(shown(s, text, end));
    s.remember_for_summary(text, end);
  });
  output_.add(s.target_fd, to_terminal);
  write_pending();  // at once, as far as the reader takes it: a line is not held back for the next poll
}

// An --output-dir file that cannot be written (a full disk, a quota) is given up, with one
// warning: the run goes on (a copy of the output is not worth a training run), and that output
// still reaches ddl's own. Giving up at once leaves a file cut short rather than one with holes.
void OutputRouter::write_output_file(int& fd, int rank, const char* suffix, std::string_view text) {
  if (fd < 0 || write_all(fd, text)) return;
  const std::string reason = std::strerror(errno);
  ::close(fd);
  fd = -1;
  report(
      fmt::format("ddl: warning: --output-dir: cannot write {}/rank.{}.{}: {}; rank {}'s output goes on "
                  "to ddl's own only\n",
                  options_.output_dir, rank, suffix, reason, rank));
}

// ddl's stdout (or stderr) is a pipe whose reader has gone (`ddl run ... | head -1`): the
// workers' pipes into it close too, so they get SIGPIPE (or EPIPE) as they would without ddl in
// between, rather than write into nothing forever.
void OutputRouter::stop_reading_into_closed_pipe(int target_fd) {
  reader_gone_ = true;
  for (auto& other : streams_) {
    if (other->target_fd != target_fd || other->fd < 0 || other->file_fd >= 0) continue;  // --output-dir: still wanted
    ::close(other->fd);
    other->fd = -1;
    other->unfinished_due.reset();
  }
}

// A worker's text as ddl's output shows it, or as its host's agent relays it.
std::string OutputRouter::shown(Stream& s, std::string_view text, char end) {
  if (options_.relay_with_rank_labels) return relayed_piece(s.rank, text, end);
  if (!shows(s.rank)) return {};
  return s.terminal->show({s.index, s.rank}, s.prefix, text, end);
}

bool OutputRouter::shows(int rank) const { return !options_.shown_ranks || options_.shown_ranks->shows(rank); }

// "[rank] ", "[host:rank] " (--prefix host) or nothing (--no-prefix).
std::string OutputRouter::line_prefix(int rank, const std::string& host) const {
  if (!options_.prefix_output) return {};
  return options_.prefix_with_host ? fmt::format("[{}:{}] ", host, rank) : rank_prefix(rank);
}

// A task launcher's line: "[rank] text" for each task line it completes (the launcher's own
// line as it is), and with --output-dir also the text alone in that rank's file; a relayed line
// naming a rank's host is kept for its prefix. False when the line only redraws tasks' lines or
// names hosts.
bool OutputRouter::emit_labelled(Stream& s, std::string_view line, char end, std::string& to_terminal) {
  using Notice = backends::TaskLine::Notice;
  std::optional<std::vector<backends::TaskLine>> labelled = (*s.labeller)(line);
  if (!labelled) {
    listener_.activity();
    to_terminal.append(s.terminal->show({s.index, kLaunchersOwnLine}, "", line, end));
    return true;
  }
  for (const backends::TaskLine& task : *labelled) {
    if (task.notice == Notice::kStack || task.notice == Notice::kStacksEnd) {
      listener_.relayed_stack(task);
      continue;
    }
    if (task.notice == Notice::kEnded) {
      listener_.relayed_end(task);
      continue;
    }
    listener_.activity();
    if (task.notice == Notice::kProgress) continue;
    if (task.notice == Notice::kHost) {
      hosts_of_ranks_[task.rank] = task.text;
      continue;
    }
    const char task_end = task.unfinished ? LineSplitter::kNoEnd : task.redrawn ? '\r' : end;
    if (shows(task.rank)) {
      auto host = hosts_of_ranks_.find(task.rank);
      const std::string prefix = line_prefix(task.rank, host != hosts_of_ranks_.end() ? host->second : "?");
      to_terminal.append(s.terminal->show({s.index, task.rank}, prefix, task.text, task_end));
    }
    if (options_.output_dir.empty()) continue;
    std::string text = task.text;
    append_with_end(text, {}, task_end);
    write_rank_file(task.rank, s.file_suffix, text);
  }
  return labelled->empty() ||
         std::any_of(labelled->begin(), labelled->end(), [](const auto& t) { return !t.redrawn && t.notice == Notice::kNone; });
}

void OutputRouter::end_open_lines() {
  output_.add(STDOUT_FILENO, stdout_lines_.end_open_line());
  if (stderr_terminal_ != &stdout_lines_) output_.add(STDERR_FILENO, stderr_lines_.end_open_line());
}

void OutputRouter::give_up() {
  for (auto& s : streams_) {
    if (s->fd >= 0) ::close(s->fd);
    s->fd = -1;
  }
  output_.clear();
}

void OutputRouter::write_rank_file(int rank, const char* suffix, const std::string& text) {
  auto key = std::make_pair(rank, std::string(suffix));
  auto it = rank_files_.find(key);
  if (it == rank_files_.end()) it = rank_files_.emplace(key, open_rank_file_late(rank, suffix)).first;
  write_output_file(it->second, rank, suffix, text);
}

// A task launcher's ranks are known from their first line only, long after the start: a file that
// cannot be opened then (out of open files, a quota) is given up as one that fails later, with a
// warning, and the run goes on.
int OutputRouter::open_rank_file_late(int rank, const char* suffix) {
  try {
    return open_output_file(options_.output_dir, rank, suffix, options_.append_output);
  } catch (const Error& e) {
    report(fmt::format("ddl: warning: {}; rank {}'s output goes on to ddl's own only\n", e.what(), rank));
    return -1;
  }
}

}  // namespace ddl::launcher
