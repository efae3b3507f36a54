// What the workers forked must not outlive ddl, even when ddl is killed without a chance to stop
// it (kill -9, the OOM killer). The workers themselves die with ddl (PR_SET_PDEATHSIG), but their
// children (`sh -c 'python train.py; ...'`, DataLoader workers, `timeout`, mpirun's daemons) would
// live on, re-parented to init. A small process forked from ddl before the first worker starts
// watches for ddl's end and then stops them: SIGTERM, and SIGKILL after the grace period.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ddl::launcher {

class OrphanGuard {
 public:
  // The variable each worker gets (its value unique to this guard), by which the guard finds what
  // the workers forked even when it left their groups and sessions.
  static constexpr const char* kMarkerVariable = "DDL_WORKER_GUARD";

  // Forks the guard, for up to `most_workers` workers (none: no guard). What it stops when ddl dies:
  // the processes of every group or session it was told of (watch()) while that id is not another
  // process's (see worker_reaped()), and every process with kMarkerVariable=marker() in its environment. The guard has a
  // session of its own, so a signal to ddl's process group does not take it away, and another name
  // ("worker-guard" in ps and its command line), so that `pkill -9 ddl` does not either.
  // With `cgroup_name` (as /proc/PID/cgroup shows it, RunCgroup::name()), every process in that
  // cgroup or below it is the run's too, and the guard removes `cgroup_folder` once it is empty.
  OrphanGuard(size_t most_workers, std::chrono::milliseconds grace_period, const std::string& cgroup_name = "",
              const std::string& cgroup_folder = "");
  ~OrphanGuard();  // stands down
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void watch(pid_t group);
  // ddl reaped the worker that led this group and session. From then on a process with its pid is
  // another's (pid reuse: Linux frees the id only once the group and session are empty too), and
  // the guard no longer goes by that id.
  void worker_reaped(pid_t group);
  // ddl cleans up itself: the guard exits touching nothing. Idempotent.
  void stand_down();
  // This guard's value of kMarkerVariable.
  const std::string& marker() const { return marker_; }
  // The guard's pid while it runs, else -1 (ddl's sweep for leftovers must spare it).
  pid_t pid() const { return pid_; }
  // ddl reaped its child `pid` (any child): if that was the guard, it is gone (killed by someone),
  // and its pid may be reused.
  void child_reaped(pid_t pid);

 private:
  void send(char what, pid_t group);

  pid_t pid_ = -1;
  int pipe_ = -1;  // write end; its closing without a stand-down means ddl died
  size_t capacity_ = 0;
  size_t watched_ = 0;
  std::string marker_;
  std::string cgroup_line_;    // "0::NAME", kept for the guard's plan
  std::string cgroup_folder_;  // kept for the guard's plan
};

}  // namespace ddl::launcher
