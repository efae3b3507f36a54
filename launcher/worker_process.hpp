// Starting one worker process: its own session (so a signal to its process group reaches
// everything it forked), stdout and stderr on pipes, stdin from /dev/null, killed if ddl dies.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "common/environment.hpp"
#include "common/error.hpp"

namespace ddl::launcher {

// A program that does not exist or cannot be executed: ddl exits with status 127, as a shell does.
class ProgramNotRunnable : public Error {
 public:
  using Error::Error;
};

// The executable that execvp() would run for `name` under `path` (the PATH value); throws
// ProgramNotRunnable naming the program when there is none or it is not executable.
std::string resolve_program(const std::string& name, const std::string& path);

// The error of a call that failed with errno `error` while making a worker's pipe or file: out of
// descriptors, one that names the limit and `ulimit -n`; otherwise `what` and strerror.
Error open_failure(const std::string& what, int error);

struct WorkerProcess {
  pid_t pid = -1;      // also its process group and session id, when it got a session of its own
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec
  int stderr_fd = -1;
};

// Forks and executes `program` with `argv` and `env`. The child runs with `child_signal_mask`
// and default SIGPIPE; if exec fails it says why on its stderr and exits 127. Its stdin is
// `stdin_fd` when given, else /dev/null. It gets a session of its own (so that a signal reaches
// what it starts too) unless `own_session` is false. With `cgroup_procs_fd` (a cgroup's
// cgroup.procs, open for writing) it enters that cgroup before it execs.
WorkerProcess spawn_worker(const std::string& program, const std::vector<std::string>& argv, const Environment& env,
                           const sigset_t& child_signal_mask, int stdin_fd = -1, bool own_session = true, int cgroup_procs_fd = -1);

// Sends `sig` to the process group of worker `pid`, which must not have been reaped yet (its pid
// could be another process's by then), or to the worker alone while it has no group: forked a
// moment ago and not yet past its setsid(). The signals ddl handles are blocked in the child until
// just before exec, so such a signal waits for it instead of being lost. True if it was sent.
bool signal_unreaped_worker(pid_t pid, int sig);

}  // namespace ddl::launcher
