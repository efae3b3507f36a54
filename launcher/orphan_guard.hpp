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
  // Forks the guard, for up to `most_workers` workers. What it stops when ddl dies: the processes of
  // every group it was told of (watch()) and not told is gone (forget()), and every process whose
  // environment holds `marker` (a NAME=value line only this run's workers get; empty: none), which
  // finds what left the workers' groups too. The guard has a session of its own, so a signal to
  // ddl's process group does not take it away, and another name ("worker-guard" in ps and its
  // command line), so that `pkill -9 ddl` does not either.
  OrphanGuard(size_t most_workers, const std::string& marker, std::chrono::milliseconds grace_period);
  ~OrphanGuard();  // stands down
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void watch(pid_t group);
  // The group is gone: its id may be another process's from now on.
  void forget(pid_t group);
  // ddl cleans up itself: the guard exits touching nothing. Idempotent.
  void stand_down();
  // ddl's reaping of any child found the guard: it is gone (killed by someone), and its pid may be reused.
  void reaped(pid_t pid);

 private:
  void send(char what, pid_t group);

  pid_t pid_ = -1;
  int pipe_ = -1;  // write end; its closing without a stand-down means ddl died
  size_t capacity_ = 0;
  size_t watched_ = 0;
};

}  // namespace ddl::launcher
