#include "launcher/stacks.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/environment.hpp"
#include "common/rank_ranges.hpp"
#include "common/worker_contract.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long long kLargestRank = 999'999'999;
constexpr long long kLargestPid = 4'194'304;  // the kernel's pid_max at most

// A file name "rank.R.<what>" (what: "progress", or "PID.stacks"): R, and the rest after its dot.
std::optional<std::pair<int, std::string>> rank_file(const std::string& name) {
  if (!name.starts_with("rank.")) return std::nullopt;
  const size_t dot = name.find('.', 5);
  if (dot == std::string::npos) return std::nullopt;
  const auto rank = whole_number(std::string_view(name).substr(5, dot - 5), kLargestRank);
  if (!rank) return std::nullopt;
  return std::make_pair(static_cast<int>(*rank), name.substr(dot + 1));
}

// Whether process `pid` holds `path` open: it is the Python process that registered it, not a
// process that took its pid after it ended (the signal would end that one).
bool holds_open(pid_t pid, const std::string& path) {
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
    std::error_code link_ec;
    if (fs::read_symlink(fd.path(), link_ec) == path) return true;
  }
  return false;
}

struct Dump {
  int rank = 0;
  pid_t pid = 0;
  std::string path;
  uintmax_t from = 0;       // the file's size before the signal
  uintmax_t last_size = 0;  // at the last look
};

uintmax_t size_of(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

// A dump's text: what the file gained since `from`, at most kLongestDump of it.
std::string read_from(const std::string& path, uintmax_t from) {
  constexpr uintmax_t kLongestDump = 1 << 20;
  const uintmax_t size = size_of(path);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(from));
  std::string text(static_cast<size_t>(size > from ? std::min(size - from, kLongestDump) : 0), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// Signals every registered Python process of `workers`' ranks that still holds its file.
std::vector<Dump> ask_python_processes(const std::string& watch_dir, const std::map<int, pid_t>& workers) {
  std::vector<Dump> dumps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(watch_dir, ec)) {
    auto named = rank_file(entry.path().filename().string());
    if (!named || !workers.count(named->first) || !named->second.ends_with(".stacks")) continue;
    const auto pid = whole_number(std::string_view(named->second).substr(0, named->second.size() - 7), kLargestPid);
    const std::string path = entry.path().string();
    if (!pid || *pid <= 0 || !holds_open(static_cast<pid_t>(*pid), path)) continue;
    Dump d{named->first, static_cast<pid_t>(*pid), path, size_of(path)};
    d.last_size = d.from;
    if (::kill(d.pid, stacks_signal()) == 0) dumps.push_back(d);
  }
  return dumps;
}

// Waits until each dump has been written (grown, then still for one look), or `wait` has passed.
void wait_for_dumps(std::vector<Dump>& dumps, std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  constexpr auto kLook = std::chrono::milliseconds(50);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(kLook);
    bool all = true;
    for (auto& d : dumps) {
      const uintmax_t size = size_of(d.path);
      all &= size > d.from && size == d.last_size;
      d.last_size = size;
    }
    if (all) return;
  }
}

// gdb's path on PATH, or empty.
std::string find_gdb() {
  const char* path = std::getenv("PATH");
  try {
    return resolve_program("gdb", path != nullptr ? path : "/usr/bin:/bin");
  } catch (const ProgramNotRunnable&) {
    return {};
  }
}

struct GdbTrace {
  std::string text;
  bool out_of_time = false;  // gdb had not finished within the wait (what it wrote by then is kept)
};

// gdb's backtraces of every thread of each of `pids`, all at once, within `wait` (what a gdb that
// has not finished by then wrote is kept, and it is killed).
std::map<pid_t, GdbTrace> gdb_backtraces(const std::string& gdb, const std::vector<pid_t>& pids, std::chrono::milliseconds wait) {
  struct Running {
    pid_t target, gdb_pid;
    int fd;
    std::string text;
  };
  std::vector<Running> running;
  for (pid_t target : pids) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) break;
    const std::string pid_text = std::to_string(target);
    std::vector<const char*> argv{gdb.c_str(), "-nx", "-batch", "-p", pid_text.c_str(), "-ex", "thread apply all bt", nullptr};
    const pid_t child = ::fork();
    if (child == 0) {
      ::setpgid(0, 0);  // the terminal's Ctrl-C and Ctrl-\ are for ddl, not for its gdb
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);  // ddl's supervisor blocks the signals it reads from a signalfd
      ::dup2(fds[1], STDOUT_FILENO);
      const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::execv(gdb.c_str(), const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    ::close(fds[1]);
    if (child < 0) {
      ::close(fds[0]);
      break;
    }
    running.push_back({target, child, fds[0], {}});
  }
  const auto deadline = Clock::now() + wait;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Running*> polled;
    for (auto& r : running)
      if (r.fd >= 0) {
        fds.push_back({r.fd, POLLIN, 0});
        polled.push_back(&r);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (fds.empty() || left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[8192];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        polled[i]->text.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(polled[i]->fd);
        polled[i]->fd = -1;
      }
    }
  }
  std::map<pid_t, GdbTrace> traces;
  for (auto& r : running) {
    const bool out_of_time = r.fd >= 0;
    if (out_of_time) ::close(r.fd);
    ::kill(r.gdb_pid, SIGKILL);  // ended already, or out of time
    ::waitpid(r.gdb_pid, nullptr, 0);
    // A gdb killed while attached can leave its target stopped: the worker must go on as it was.
    if (out_of_time) ::kill(r.target, SIGCONT);
    traces[r.target] = {std::move(r.text), out_of_time};
  }
  return traces;
}

constexpr size_t kLongestStackLine = 4096;

// A stack as it is shown and compared: thread ids, addresses, process ids and a frame's argument
// values left out (they differ between ranks that are in the same place), gdb's chatter dropped.
std::string normalized(const std::string& stacks) {
  static const std::regex python_thread(R"re(^(Current thread|Thread) 0x[0-9a-fA-F]+ (.*)$)re");
  static const std::regex gdb_thread(R"re(^Thread \d+ \(.*?\)(?: "(.*)")?\)?:?\s*$)re");
  static const std::regex gdb_frame(R"re(^#(\d+)\s+(?:0x[0-9a-fA-F]+ in )?(\S+) \(.*?\)(?: (at|from) (\S+))?.*$)re");
  std::istringstream lines(stacks);
  std::string line, shown;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (line.size() > kLongestStackLine) continue;  // std::regex recurses per character; no frame is this long
    if (std::regex_match(line, m, python_thread)) {
      shown += "Thread " + m[2].str() + "\n";
    } else if (line.starts_with("  File ") || line.starts_with("Stack (most recent call first)")) {
      shown += line + "\n";
    } else if (std::regex_match(line, m, gdb_thread)) {
      shown += m[1].matched ? fmt::format("Thread \"{}\":\n", m[1].str()) : "Thread:\n";
    } else if (std::regex_match(line, m, gdb_frame)) {
      shown += fmt::format("  #{} {}{}\n", m[1].str(), m[2].str(), m[3].matched ? fmt::format(" {} {}", m[3].str(), m[4].str()) : "");
    }
  }
  return shown;
}

// Where the stacks' last thread (the main one: faulthandler and gdb list it last) is: its innermost
// frame, "step (train.py:40)"; empty when there is no frame.
std::string where(const std::string& shown) {
  static const std::regex python_frame(R"re(^  File "(.*)", line (\d+) in (.*)$)re");
  static const std::regex gdb_frame(R"re(^  #\d+ (\S+)(?: (?:at|from) (\S+))?$)re");
  std::istringstream lines(shown);
  std::string line, innermost;
  bool first_of_thread = false;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (line.size() > kLongestStackLine) continue;
    if (line.starts_with("Thread") || line.starts_with("Stack")) {
      first_of_thread = true;
      continue;
    }
    if (!first_of_thread) continue;
    first_of_thread = false;
    if (std::regex_match(line, m, python_frame))
      innermost = fmt::format("{} ({}:{})", m[3].str(), fs::path(m[1].str()).filename().string(), m[2].str());
    else if (std::regex_match(line, m, gdb_frame))
      innermost = m[2].matched ? fmt::format("{} ({})", m[1].str(), fs::path(m[2].str()).filename().string()) : m[1].str();
  }
  return innermost;
}

}  // namespace

int stacks_signal() { return SIGRTMIN + 5; }

WatchDir::WatchDir() {
  // $TMPDIR first; /tmp where that cannot hold it (a job's TMPDIR gone stale, or never made): without
  // the folder the hang watchdog counts output alone, and stopped runs that were making progress.
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern;
  for (const char* dir : {tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tmp"}) {
    pattern = fmt::format("{}/ddl-watch.XXXXXX", dir);
    if (::mkdtemp(pattern.data()) != nullptr) break;
    pattern.clear();
  }
  if (pattern.empty()) return;
  // As the kernel names it (no symbolic link, not relative): the path a worker's open file shows
  // in /proc, and one that still holds after a worker changes directory.
  std::error_code ec;
  const fs::path real = fs::canonical(pattern, ec);
  path_ = ec ? pattern : real.string();
}

WatchDir::~WatchDir() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void WatchDir::add_to(Environment& env) const {
  if (path_.empty()) return;
  env[contract::kWatchDir] = path_;
  env[contract::kStacksSignal] = std::to_string(stacks_signal());
}

std::map<int, fs::file_time_type> WatchDir::progress() const {
  std::map<int, fs::file_time_type> marks;
  if (path_.empty()) return marks;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path_, ec)) {
    auto named = rank_file(entry.path().filename().string());
    if (!named || named->second != "progress") continue;
    std::error_code time_ec;
    const auto time = fs::last_write_time(entry.path(), time_ec);
    if (!time_ec) marks[named->first] = time;
  }
  return marks;
}

std::map<int, RankStacks> collect_stacks(const std::string& watch_dir, const std::map<int, pid_t>& workers,
                                         std::chrono::milliseconds python_wait, std::chrono::milliseconds native_wait) {
  std::map<int, RankStacks> stacks;
  std::vector<Dump> dumps = watch_dir.empty() ? std::vector<Dump>{} : ask_python_processes(watch_dir, workers);
  if (!dumps.empty()) wait_for_dumps(dumps, python_wait);
  for (const auto& d : dumps) {
    std::string text = read_from(d.path, d.from);
    if (text.empty()) continue;
    std::string& into = stacks[d.rank].text;
    if (!into.empty()) into += "\n";
    into += text;
  }
  std::vector<pid_t> native;
  for (const auto& [rank, pid] : workers)
    if (!stacks.count(rank)) native.push_back(pid);
  const std::string gdb = native.empty() ? std::string() : find_gdb();
  const auto traces = gdb.empty() ? std::map<pid_t, GdbTrace>{} : gdb_backtraces(gdb, native, native_wait);
  for (const auto& [rank, pid] : workers) {
    if (stacks.count(rank)) continue;
    auto trace = traces.find(pid);
    if (trace != traces.end() && !normalized(trace->second.text).empty()) {
      stacks[rank].text = trace->second.text;
    } else if (gdb.empty()) {
      stacks[rank].none_because = "not a Python program started by ddl run, and there is no gdb to read a native stack";
    } else if (trace != traces.end() && trace->second.out_of_time) {
      stacks[rank].none_because = fmt::format("not a Python program started by ddl run, and gdb had not read its stack within {} s",
                                              std::chrono::duration_cast<std::chrono::seconds>(native_wait).count());
    } else {
      stacks[rank].none_because = "not a Python program started by ddl run, and gdb could not read its stack (ptrace refused?)";
    }
  }
  return stacks;
}

std::string stacks_report(const std::map<int, RankStacks>& stacks) {
  // Identical shown stacks (or identical reasons for none) together, the largest group first.
  std::map<std::string, std::vector<int>> groups;
  for (const auto& [rank, s] : stacks) {
    const std::string shown = normalized(s.text);
    groups[shown.empty() ? "\n" + s.none_because : shown].push_back(rank);
  }
  std::vector<std::pair<std::string, std::vector<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.second.size() != b.second.size() ? a.second.size() > b.second.size() : a.second.front() < b.second.front();
  });
  std::string report;
  for (const auto& [shown, ranks] : ordered) {
    const std::string who = fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", rank_ranges(ranks, ", "));
    if (shown.starts_with("\n")) {
      report += fmt::format("ddl: {}: no stack: {}\n", who, shown.substr(1));
      continue;
    }
    const std::string at = where(shown);
    report += at.empty() ? fmt::format("ddl: {}:\n", who) : fmt::format("ddl: {}: in {}\n", who, at);
    std::istringstream lines(shown);
    std::string line;
    while (std::getline(lines, line)) report += "    " + line + "\n";
  }
  return report;
}

}  // namespace ddl::launcher
