// What the workers forked must not outlive ddl, even when ddl is killed without a chance to stop
// it (kill -9, the OOM killer). The workers themselves die with ddl (PR_SET_PDEATHSIG), but their
// children (`sh -c 'python train.py; ...'`, DataLoader workers, mpirun's daemons) would live on,
// re-parented to init. A small process forked from ddl watches for ddl's end and then stops the
// workers' process groups: SIGTERM, and SIGKILL after the grace period.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace ddl::launcher {

class OrphanGuard {
 public:
  // Starts watching `groups` (process group ids of workers that have a session of their own); does
  // nothing when there are none. The guard leaves ddl's session, so a signal to ddl's process
  // group does not take it away too.
  OrphanGuard(const std::vector<pid_t>& groups, std::chrono::milliseconds grace_period);
  ~OrphanGuard();  // stands down
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // ddl is cleaning up itself: the guard exits without touching anything. Idempotent.
  void stand_down();

 private:
  pid_t pid_ = -1;
  int pipe_ = -1;  // write end: one byte stands the guard down; its closing without one means ddl died
};

}  // namespace ddl::launcher
