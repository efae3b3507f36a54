#include "launcher/worker_process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/write_all.hpp"

namespace ddl::launcher {

namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// How to run a script through its interpreter, by its name: "python3 t.py".
std::string through_interpreter(const std::string& name) {
  if (name.ends_with(".py")) return "python3 " + name;
  if (name.ends_with(".sh")) return "bash " + name;
  return "INTERPRETER " + name;
}

// A script's #! line must name an interpreter that exists and can be run: exec would otherwise fail
// only once the workers start, with "No such file or directory" about a script that exists.
void require_interpreter(const std::string& name, std::string_view head) {
  std::string_view line = head.substr(2, head.find('\n') == std::string_view::npos ? std::string_view::npos : head.find('\n') - 2);
  const size_t start = line.find_first_not_of(" \t");
  if (start == std::string_view::npos)
    throw ProgramNotRunnable(fmt::format("program '{}' has a #! line that names no interpreter", name),
                             "make its first line name one, such as #!/usr/bin/env python3");
  line.remove_prefix(start);
  const std::string interpreter(line.substr(0, line.find_first_of(" \t")));
  if (is_executable_file(interpreter)) return;
  if (interpreter.ends_with('\r') && is_executable_file(interpreter.substr(0, interpreter.size() - 1)))
    throw ProgramNotRunnable(fmt::format("program '{}' has a #! line that ends in a carriage return (Windows line ends), so its "
                                         "interpreter '{}' cannot be found",
                                         name, interpreter.substr(0, interpreter.size() - 1)),
                             fmt::format("convert the file to Unix line ends: dos2unix {} (or sed -i 's/\\r$//' {})", name, name));
  const bool exists = ::access(interpreter.c_str(), F_OK) == 0;
  throw ProgramNotRunnable(fmt::format("program '{}' names the interpreter '{}' on its #! line, which {}", name, interpreter,
                                       exists ? "is not an executable file" : "does not exist"),
                           fmt::format("fix its first line (#!/usr/bin/env NAME finds NAME on PATH), or run it through an "
                                       "interpreter: ddl run ... -- {}",
                                       through_interpreter(name)));
}

// A file the kernel can execute: a binary (ELF) or a script with a #! line. Anything else fails
// with "Exec format error" only once the workers start, so it is refused before.
void require_executable_format(const std::string& name, const std::string& path) {
  char head[256] = {};  // the kernel reads a #! line this far (BINPRM_BUF_SIZE)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // readable by exec only: let exec say what it thinks
  const ssize_t n = ::read(fd, head, sizeof head);
  ::close(fd);
  const bool elf = n >= 4 && std::memcmp(head,
                                         "\x7f"
                                         "ELF",
                                         4) == 0;
  const bool script = n >= 2 && head[0] == '#' && head[1] == '!';
  if (elf) return;
  if (script) {
    require_interpreter(name, std::string_view(head, static_cast<size_t>(n)));
    return;
  }
  throw ProgramNotRunnable(fmt::format("program '{}' is neither a binary nor a script with a #! line, so it cannot be run", name),
                           fmt::format("add a first line such as #!/usr/bin/env python3, or run it through its interpreter: "
                                       "ddl run ... -- {}",
                                       through_interpreter(name)));
}

}  // namespace

std::string resolve_program(const std::string& name, const std::string& path) {
  // An empty name is no program at all: a usage error (exit 2), as a missing one is, not "cannot run" (127).
  if (name.empty()) throw UsageError("no program to run", "put the program after --: ddl run -np 4 -- python train.py");
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name)) {
      require_executable_format(name, name);
      return name;
    }
    bool exists = ::access(name.c_str(), F_OK) == 0;
    throw ProgramNotRunnable(fmt::format("program '{}' {}", name, exists ? "is not an executable file" : "does not exist"),
                             exists ? "check its permissions (chmod +x) or run it through its interpreter" : "check the path");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) {
      require_executable_format(name, candidate);
      return candidate;
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (::access(name.c_str(), F_OK) == 0)  // in the current folder, which PATH lookup does not search (as a shell)
    throw ProgramNotRunnable(fmt::format("program '{}' was not found in PATH; the one in the current folder is not looked for there", name),
                             fmt::format("run it as ./{} or as {}", name, through_interpreter(name)));
  throw ProgramNotRunnable(fmt::format("program '{}' was not found in PATH", name),
                           "check the spelling, load its module or environment, or give its full path");
}

Error open_failure(const std::string& what, int error) {
  const std::string message = fmt::format("{}: {}", what, std::strerror(error));
  if (error == ENFILE)
    return Error(message, "the system's table of open files is full (fs.file-max): end what holds many open, or ask the admins");
  if (error != EMFILE) return Error(message, "");
  struct rlimit limit {};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  const std::string held = fmt::format(
      "ddl holds 2 open files per worker on this host (4 with --output-dir), under a limit of {} "
      "(ulimit -n)",
      limit.rlim_cur);
  if (limit.rlim_cur >= limit.rlim_max) return Error(message, held + ", which is also the hard limit: run fewer workers on this host");
  const rlim_t raised = std::min<rlim_t>(limit.rlim_max, std::max<rlim_t>(4096, 2 * limit.rlim_cur));
  return Error(message, fmt::format("{}: raise it first (ulimit -n {}), or run fewer workers", held, raised));
}

WorkerProcess spawn_worker(const std::string& program, const std::vector<std::string>& argv, const Environment& env,
                           const sigset_t& child_signal_mask, int stdin_fd, bool own_session, int cgroup_procs_fd) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw open_failure("cannot create a pipe for a worker", errno);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw open_failure("cannot create a pipe for a worker", error);
  }

  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings = to_envp(env);
  std::vector<char*> c_argv;
  c_argv.reserve(argv.size());
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_env;
  c_env.reserve(env_strings.size());
  for (const auto& e : env_strings) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  const std::string exec_failed = fmt::format("ddl: cannot execute '{}': ", program);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    throw Error(fmt::format("cannot start a worker: fork failed: {}", std::strerror(err)), "the node may be out of processes or memory");
  }
  if (pid == 0) {
    if (own_session) ::setsid();
    if (cgroup_procs_fd >= 0) (void)!::write(cgroup_procs_fd, "0", 1);  // "0": this process; the guard still goes by its session if not
    // Workers never outlive ddl: if ddl is killed, the kernel kills the worker.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(137);
    // Where Yama lets only a process's ancestors attach (ptrace_scope 1), ddl and what it starts
    // (the hang watchdog's gdb) may still read this worker's stack. Kept across exec; a no-op without Yama.
    ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    const int null_fd = stdin_fd >= 0 ? -1 : ::open("/dev/null", O_RDONLY);
    ::dup2(stdin_fd >= 0 ? stdin_fd : null_fd, STDIN_FILENO);
    if (null_fd > STDIN_FILENO) ::close(null_fd);  // else the worker inherits a stray descriptor of it
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_signal_mask, nullptr);
    ::execve(program.c_str(), c_argv.data(), c_env.data());
    const char* reason = std::strerror(errno);
    (void)write_all(STDERR_FILENO, exec_failed);  // the child's last words: nothing to do if they fail
    (void)write_all(STDERR_FILENO, reason);
    (void)write_all(STDERR_FILENO, "\n");
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  return {pid, out_pipe[0], err_pipe[0]};
}

bool signal_unreaped_worker(pid_t pid, int sig) {
  if (pid <= 0) return false;  // never started: kill(-pid) would reach init, kill(-1) everyone
  if (::kill(-pid, sig) == 0) return true;
  return errno == ESRCH && ::kill(pid, sig) == 0;
}

}  // namespace ddl::launcher
