#include "launcher/orphan_guard.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

#include <fmt/format.h>

namespace ddl::launcher {

namespace {

constexpr char kName[] = "worker-guard";
constexpr size_t kLongestMarker = 512;

// One message to the guard: 8 bytes, so that each write to the pipe is atomic and each read whole.
struct Message {
  int32_t what;  // '+' watch, 'r' its worker was reaped, 'd' stand down
  int32_t group;
};

// Everything the guard needs, made ready before fork: a forked child of a process with threads may
// make only async-signal-safe calls, so the guard allocates nothing and reads /proc with syscalls.
struct Plan {
  int watch_fd = -1;
  int write_fd = -1;
  pid_t* groups = nullptr;  // capacity entries; 0: free
  bool* reaped = nullptr;   // capacity entries: groups[i]'s worker was reaped by ddl
  size_t capacity = 0;
  pid_t* terminated = nullptr;  // what got SIGTERM already (up to terminated_capacity): once is enough
  size_t terminated_capacity = 0;
  const char* marker = nullptr;  // "\0NAME=value\0": how the line appears in /proc/PID/environ
  size_t marker_length = 0;
  long long grace_ms = 0;
  int highest_fd = 0;
  bool* seen = nullptr;  // capacity entries: a member of groups[i]'s group or session found in this sweep
  // ddl's argv and environment areas (/proc/self/stat's arg_start..env_end), which the guard blanks:
  // its command line then reads kName, and its environment no longer holds an outer run's marker
  // (under a nested `ddl run`, the outer guard would take this guard for a process of its run).
  char* arguments = nullptr;
  size_t arguments_length = 0;
  char* environment = nullptr;
  size_t environment_length = 0;
  const char* cgroup_line = nullptr;  // "0::NAME" of the run's cgroup (RunCgroup), or nullptr
  size_t cgroup_line_length = 0;
  const char* cgroup_folder = nullptr;  // removed once the run is gone
};

long long monotonic_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

void pause_ms(long ms) {
  timespec pause{0, ms * 1'000'000};
  while (::nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
}

bool holds(const pid_t* ids, size_t count, pid_t id) {
  for (size_t i = 0; i < count; ++i)
    if (ids[i] == id) return true;
  return false;
}

// Whether `id` is a watched group (as a process's group or session id); marks it seen.
bool mark_seen(const Plan& plan, pid_t id) {
  if (id <= 0) return false;
  for (size_t i = 0; i < plan.capacity; ++i) {
    if (plan.groups[i] != id) continue;
    plan.seen[i] = true;
    return true;
  }
  return false;
}

// "/proc/<pid>/<leaf>" into `out`, from the directory entry's name.
void proc_path(char* out, const char* pid, const char* leaf) {
  std::memcpy(out, "/proc/", 6);
  size_t at = 6;
  for (const char* c = pid; *c != '\0' && at < 40; ++c) out[at++] = *c;
  out[at++] = '/';
  for (const char* c = leaf; *c != '\0'; ++c) out[at++] = *c;
  out[at] = '\0';
}

// Reads up to `size` - 1 bytes of /proc/PID/`what` into `text`; how many (0 when it is gone or unreadable).
ssize_t read_proc_file(const char* pid, const char* what, char* text, size_t size) {
  char path[64];
  proc_path(path, pid, what);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, text, size - 1);
  ::close(fd);
  return n < 0 ? 0 : n;
}

// From /proc/PID/stat, "pid (comm) state ppid pgrp session ...": false when it is gone or unreadable.
bool read_stat(const char* pid, char& state, long& group, long& session) {
  char text[512];
  const ssize_t n = read_proc_file(pid, "stat", text, sizeof text);
  if (n <= 0) return false;
  text[n] = '\0';
  const char* at = nullptr;
  for (ssize_t i = n - 1; i >= 0 && at == nullptr; --i)  // the name may hold ')': the last one ends it
    if (text[i] == ')') at = text + i + 1;
  if (at == nullptr) return false;
  long fields[3] = {0, 0, 0};  // ppid, pgrp, session
  while (*at == ' ') ++at;
  state = *at++;
  for (long& field : fields) {
    while (*at == ' ') ++at;
    bool negative = *at == '-';
    if (negative) ++at;
    if (*at < '0' || *at > '9') return false;
    while (*at >= '0' && *at <= '9') field = field * 10 + (*at++ - '0');
    if (negative) field = -field;
  }
  group = fields[1];
  session = fields[2];
  return true;
}

// Whether the environment of process `pid` (one of this user's: others' cannot be read) has the line.
bool environment_holds(const char* pid, const char* marker, size_t length) {
  char path[64];
  proc_path(path, pid, "environ");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char window[8192 + kLongestMarker + 2];
  size_t have = 1;
  window[0] = '\0';  // the first line has no '\0' before it
  bool found = false;
  for (ssize_t n = 0; !found && (n = ::read(fd, window + have, 8192)) > 0;) {
    have += static_cast<size_t>(n);
    for (size_t i = 0; !found && i + length <= have; ++i) found = std::memcmp(window + i, marker, length) == 0;
    const size_t keep = have < length - 1 ? have : length - 1;
    std::memmove(window, window + have - keep, keep);
    have = keep;
  }
  ::close(fd);
  return found;
}

// Whether process `name` (its pid, as text) is in the run's cgroup or below it: a line of
// /proc/PID/cgroup is "0::NAME" followed by its end or by "/".
bool in_run_cgroup(const Plan& plan, const char* name) {
  if (plan.cgroup_line == nullptr) return false;
  char text[4096];
  const ssize_t n = read_proc_file(name, "cgroup", text, sizeof text);
  if (n <= 0) return false;
  for (ssize_t line = 0; line < n;) {
    const size_t rest = static_cast<size_t>(n - line);
    if (rest >= plan.cgroup_line_length && std::memcmp(text + line, plan.cgroup_line, plan.cgroup_line_length) == 0) {
      const ssize_t after = line + static_cast<ssize_t>(plan.cgroup_line_length);
      if (after == n || text[after] == '\n' || text[after] == '/') return true;
    }
    while (line < n && text[line] != '\n') ++line;
    ++line;
  }
  return false;
}

// Sends `sig` to every live process of the run: in a watched group or session, or with the run's
// line in its environment. SIGTERM goes once to each (a process forked meanwhile gets it on a later
// sweep). Returns how many there were.
int sweep(const Plan& plan, int sig) {
  for (size_t i = 0; i < plan.capacity; ++i) {
    plan.seen[i] = false;
    // A reaped worker's pid in use again is another process's: its group and session were empty
    // when the pid was freed, so whatever has that id now is not of this run.
    if (plan.groups[i] != 0 && plan.reaped[i] && (::kill(plan.groups[i], 0) == 0 || errno == EPERM)) plan.groups[i] = 0;
  }
  size_t terminated = 0;
  while (terminated < plan.terminated_capacity && plan.terminated[terminated] != 0) ++terminated;
  const int proc = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return 0;
  const pid_t self = ::getpid();
  int found = 0;
  alignas(8) char entries[16384];
  for (long n = 0; (n = ::syscall(SYS_getdents64, proc, entries, sizeof entries)) > 0;) {
    for (long at = 0; at < n;) {
      // struct linux_dirent64: inode (8), offset (8), record length (2), type (1), name
      unsigned short record = 0;
      std::memcpy(&record, entries + at + 16, sizeof record);
      if (record == 0) break;  // never from a sane kernel; it would loop here for good
      const char* name = entries + at + 19;
      at += record;
      if (name[0] < '1' || name[0] > '9') continue;
      pid_t pid = 0;
      for (const char* c = name; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      char state = 0;
      long group = 0, session = 0;
      if (pid == self || !read_stat(name, state, group, session)) continue;
      const bool by_group = mark_seen(plan, static_cast<pid_t>(group));  // both marked: each is seen
      const bool by_session = mark_seen(plan, static_cast<pid_t>(session));
      const bool in_group = by_group || by_session;
      if (state == 'Z') continue;
      // Reading the environment of a process in uninterruptible sleep (a hung NFS mount) could
      // block the guard: such a process is left to its group, if it is in one.
      const bool ours = in_group || in_run_cgroup(plan, name) ||
                        (state != 'D' && plan.marker_length > 0 && environment_holds(name, plan.marker, plan.marker_length));
      if (!ours) continue;
      ++found;
      if (sig == SIGTERM) {
        if (holds(plan.terminated, terminated, pid)) continue;
        if (terminated < plan.terminated_capacity) plan.terminated[terminated++] = pid;
        ::kill(pid, SIGTERM);
        ::kill(pid, SIGCONT);  // a stopped process acts on SIGTERM only when continued
        continue;
      }
      ::kill(pid, sig);
    }
  }
  ::close(proc);
  // A watched group with no member left (not even a zombie) is gone, and its id may be another
  // process's from now on (pid reuse): it is watched no more.
  for (size_t i = 0; i < plan.capacity; ++i)
    if (!plan.seen[i]) plan.groups[i] = 0;
  return found;
}

// Reads ddl's messages until it stands the guard down, or ends without doing so.
bool ddl_died(const Plan& plan) {
  for (;;) {
    Message m{};
    const ssize_t n = ::read(STDIN_FILENO, &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof m)) return true;  // the end of the pipe: ddl is gone
    if (m.what == 'd') return false;
    for (size_t i = 0; i < plan.capacity; ++i) {
      if (m.what == '+' && plan.groups[i] == 0) {
        plan.groups[i] = m.group;
        plan.reaped[i] = false;
        break;
      }
      if (m.what == 'r' && plan.groups[i] == m.group) {
        plan.reaped[i] = true;
        break;
      }
    }
  }
}

// The run is gone: its cgroup is removed (once its last zombies are reaped), and the guard exits.
[[noreturn]] void leave(const Plan& plan) {
  for (int attempt = 0; plan.cgroup_folder != nullptr && attempt < 200 && ::rmdir(plan.cgroup_folder) != 0 && errno == EBUSY; ++attempt)
    pause_ms(10);
  ::_exit(0);
}

[[noreturn]] void guard(const Plan& plan) {
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);  // Ctrl-C and the like are for ddl, not for the guard
  ::setsid();
  ::prctl(PR_SET_NAME, kName);
  if (plan.environment != nullptr) std::memset(plan.environment, 0, plan.environment_length);
  if (plan.arguments != nullptr) {
    std::memset(plan.arguments, 0, plan.arguments_length);
    const size_t name_length = sizeof kName - 1 < plan.arguments_length ? sizeof kName - 1 : plan.arguments_length - 1;
    std::memcpy(plan.arguments, kName, name_length);
  }
  ::close(plan.write_fd);  // else the guard would hold the pipe open itself and never see ddl's end
  ::dup2(plan.watch_fd, STDIN_FILENO);
  // ddl's output, the workers' pipes, the store's socket are not the guard's to hold open.
  if (::close_range(STDOUT_FILENO, ~0U, 0) != 0)  // ENOSYS before Linux 5.9, EPERM under some seccomp filters
    for (int fd = STDOUT_FILENO; fd <= plan.highest_fd; ++fd) ::close(fd);
  if (::chdir("/") != 0) {
    // no matter: it only keeps the directory busy
  }
  if (!ddl_died(plan)) ::_exit(0);
  if (sweep(plan, SIGTERM) == 0) leave(plan);
  const long long deadline = monotonic_ms() + plan.grace_ms;
  while (monotonic_ms() < deadline) {
    pause_ms(20);
    if (sweep(plan, SIGTERM) == 0) leave(plan);
  }
  sweep(plan, SIGKILL);
  leave(plan);
}

// For the mark: unpredictable where the system has a random source, else at least this moment's.
uint64_t random_64_bits() {
  try {
    std::random_device random;
    return (uint64_t{random()} << 32) ^ random();
  } catch (const std::exception&) {
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
}

int highest_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > (1U << 20)) return 1 << 20;
  return static_cast<int>(limit.rlim_cur);
}

// Where the kernel finds this process's command line and environment: /proc/self/stat's fields
// 48-51 (arg_start, arg_end, env_start, env_end). False when they cannot be read.
bool own_argument_areas(Plan& plan) {
  std::ifstream file("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto name_end = text.rfind(')');
  if (name_end == std::string::npos) return false;
  std::istringstream fields(text.substr(name_end + 2));  // from field 3, the state
  std::string field;
  unsigned long long value[4] = {0, 0, 0, 0};
  for (int number = 3; number <= 51 && fields >> field; ++number)
    if (number >= 48) value[number - 48] = std::strtoull(field.c_str(), nullptr, 10);
  if (value[0] == 0 || value[1] <= value[0] || value[3] < value[2]) return false;
  plan.arguments = reinterpret_cast<char*>(static_cast<uintptr_t>(value[0]));
  plan.arguments_length = value[1] - value[0];
  plan.environment = value[3] > value[2] ? reinterpret_cast<char*>(static_cast<uintptr_t>(value[2])) : nullptr;
  plan.environment_length = value[3] - value[2];
  return true;
}

}  // namespace

OrphanGuard::OrphanGuard(size_t most_workers, std::chrono::milliseconds grace_period, const std::string& cgroup_name,
                         const std::string& cgroup_folder)
    : capacity_(most_workers), cgroup_line_(cgroup_name.empty() ? "" : "0::" + cgroup_name), cgroup_folder_(cgroup_folder) {
  if (most_workers == 0) return;
  marker_ = fmt::format("{}.{:016x}", ::getpid(), random_64_bits());
  const std::string marker = std::string(kMarkerVariable) + "=" + marker_;
  std::vector<pid_t> groups(most_workers, 0);
  std::vector<pid_t> terminated(4 * most_workers + 1024, 0);
  const std::string marker_line = '\0' + marker + '\0';
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no guard: ddl still cleans up whenever it lives to
  Plan plan;
  plan.watch_fd = fds[0];
  plan.write_fd = fds[1];
  plan.groups = groups.data();
  plan.capacity = groups.size();
  plan.terminated = terminated.data();
  plan.terminated_capacity = terminated.size();
  plan.marker = marker_line.data();
  plan.marker_length = marker_line.size();
  plan.grace_ms = grace_period.count();
  plan.highest_fd = highest_fd_limit();
  if (!cgroup_line_.empty()) {
    plan.cgroup_line = cgroup_line_.c_str();
    plan.cgroup_line_length = cgroup_line_.size();
    plan.cgroup_folder = cgroup_folder_.c_str();
  }
  std::unique_ptr<bool[]> seen(new bool[most_workers]());
  plan.seen = seen.get();
  std::unique_ptr<bool[]> reaped(new bool[most_workers]());
  plan.reaped = reaped.get();
  own_argument_areas(plan);
  const pid_t pid = ::fork();
  if (pid == 0) guard(plan);
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    return;
  }
  pid_ = pid;
  pipe_ = fds[1];
  ::fcntl(pipe_, F_SETFL, O_NONBLOCK);  // a guard that stopped reading must not stop ddl
}

OrphanGuard::~OrphanGuard() { stand_down(); }

void OrphanGuard::watch(pid_t group) {
  if (watched_ >= capacity_) return;
  ++watched_;
  send('+', group);
}

void OrphanGuard::worker_reaped(pid_t group) { send('r', group); }

// A guard that does not take a message within a second (stopped, frozen) is of no more use: it is
// killed (it is ddl's unreaped child, so its pid is still its own), and ddl cleans up alone.
void OrphanGuard::send(char what, pid_t group) {
  if (pipe_ < 0) return;
  const Message m{what, static_cast<int32_t>(group)};
  for (int waited = 0; waited < 1000; ++waited) {
    if (::write(pipe_, &m, sizeof m) == static_cast<ssize_t>(sizeof m)) return;
    if (errno != EAGAIN && errno != EINTR) break;
    pollfd writable{pipe_, POLLOUT, 0};
    ::poll(&writable, 1, 1);
  }
  if (pid_ > 0) ::kill(pid_, SIGKILL);  // never kill(-1): that would reach every process
  stand_down();
}

void OrphanGuard::stand_down() {
  if (pipe_ < 0) return;
  const Message m{'d', 0};
  const bool told = ::write(pipe_, &m, sizeof m) == static_cast<ssize_t>(sizeof m);
  ::close(pipe_);
  pipe_ = -1;
  if (pid_ <= 0) return;
  // Else it would take the closed pipe for ddl's death. A stopped guard (SIGSTOP) is continued, to
  // read the message; one that still does not end within a second (frozen) must not keep ddl.
  ::kill(pid_, told ? SIGCONT : SIGKILL);
  const long long deadline = monotonic_ms() + 1000;
  while (monotonic_ms() < deadline) {
    const pid_t done = ::waitpid(pid_, nullptr, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      pid_ = -1;
      return;
    }
    timespec pause{0, 100'000};
    ::nanosleep(&pause, nullptr);
  }
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {}
  pid_ = -1;
}

void OrphanGuard::child_reaped(pid_t pid) {
  if (pid_ < 0 || pid != pid_) return;
  pid_ = -1;
  if (pipe_ >= 0) ::close(pipe_);
  pipe_ = -1;
}

}  // namespace ddl::launcher
