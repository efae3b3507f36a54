#include "launcher/orphan_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace ddl::launcher {

namespace {

long long monotonic_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

bool any_group_left(const pid_t* groups, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (::kill(-groups[i], 0) == 0) return true;
  return false;
}

void signal_groups(const pid_t* groups, size_t count, int sig) {
  for (size_t i = 0; i < count; ++i) ::kill(-groups[i], sig);
}

// The guard's whole life, in the forked child of a process that may have threads: only
// async-signal-safe calls. A group id cannot name another group meanwhile: Linux does not reuse a
// process id while a group of that id has members.
[[noreturn]] void guard(int watch_fd, const pid_t* groups, size_t count, long long grace_ms) {
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);  // Ctrl-C and the like are for ddl, not for the guard
  ::setsid();
  ::prctl(PR_SET_NAME, "ddl-guard");  // in ps and top: not a second ddl
  ::dup2(watch_fd, STDIN_FILENO);
  ::close_range(STDOUT_FILENO, ~0U, 0);  // ddl's output, the workers' pipes, the store's socket: not the guard's to hold
  if (::chdir("/") != 0) {
    // no matter: it only keeps the directory busy
  }
  char byte = 0;
  ssize_t n = 0;
  while ((n = ::read(STDIN_FILENO, &byte, 1)) < 0 && errno == EINTR) {}
  if (n == 1) ::_exit(0);  // stood down
  // ddl is gone without cleaning up: what the workers left goes as a failed run's would.
  signal_groups(groups, count, SIGTERM);
  signal_groups(groups, count, SIGCONT);  // a stopped process acts on SIGTERM only when continued
  const long long deadline = monotonic_ms() + grace_ms;
  while (any_group_left(groups, count) && monotonic_ms() < deadline) {
    timespec pause{0, 20'000'000};
    ::nanosleep(&pause, nullptr);
  }
  signal_groups(groups, count, SIGKILL);
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard(const std::vector<pid_t>& groups, std::chrono::milliseconds grace_period) {
  if (groups.empty()) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no guard: ddl still cleans up whenever it can
  const pid_t pid = ::fork();
  if (pid == 0) guard(fds[0], groups.data(), groups.size(), grace_period.count());
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    return;
  }
  pid_ = pid;
  pipe_ = fds[1];
}

OrphanGuard::~OrphanGuard() { stand_down(); }

void OrphanGuard::stand_down() {
  if (pipe_ < 0) return;
  const char byte = 'd';
  while (::write(pipe_, &byte, 1) < 0 && errno == EINTR) {}
  ::close(pipe_);
  pipe_ = -1;
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {}
  pid_ = -1;
}

}  // namespace ddl::launcher
