// Requeue at the time limit, for `ddl run --requeue-signal` in a Slurm batch job. The signal Slurm
// sends before the limit (sbatch --signal=B:USR1@120, as `ddl submit --requeue` writes it) is passed
// on to the workers, for them to save and end; once they have, ddl puts the job back in the queue
// (scontrol requeue) while it has been requeued fewer than --max-requeues times, and the next start
// continues from what they saved.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/environment.hpp"
#include "launcher/supervisor.hpp"

namespace ddl::launcher {

struct RequeuePolicy {
  int signal = SIGUSR1;
  int max_requeues = 5;
  // --requeue-grace: how long the workers have to save and end after the signal; unset: until
  // shortly before the time limit (the limit less the grace period and kRequeueMargin).
  std::optional<std::chrono::milliseconds> grace;
};

// What is left of the time limit after the workers' time: stopping the late ones, reading their
// last output and requeueing, all before Slurm ends the job.
inline constexpr std::chrono::seconds kRequeueMargin{10};
// The workers' time when the time limit is not known (squeue does not say).
inline constexpr std::chrono::seconds kRequeueGraceWithoutLimit{60};
// The least time the workers get, however late the signal came.
inline constexpr std::chrono::seconds kLeastRequeueGrace{1};

// The signal `name` names (USR1, SIGUSR1, usr1; USR2). Throws UsageError naming `flag` for any
// other: srun answers SIGTERM and SIGHUP by killing every task at once, and a host's agent by
// stopping its workers after the grace period, so no worker could save on them.
int requeue_signal_named(const std::string& name, const std::string& flag);

// Keeps `signal` blocked for the whole of `ddl run` (its default would end ddl in the moments
// between supervisors, where nothing reads it), and drops one still pending at the end.
class HeldSignal {
 public:
  explicit HeldSignal(int signal);
  ~HeldSignal();
  HeldSignal(const HeldSignal&) = delete;
  HeldSignal& operator=(const HeldSignal&) = delete;

 private:
  int signal_;
  sigset_t original_{};
};

// How many times this batch job has been requeued so far: Slurm's SLURM_RESTART_COUNT, else 0.
int requeue_count(const Environment& env);

// How the supervisor is to take the signal: the workers' deadline is worked out when it comes,
// from --requeue-grace and the time Slurm says is left then. Throws UsageError when this is no
// Slurm batch job.
FinishRequest finish_request(const RequeuePolicy& policy, const Environment& env, std::chrono::milliseconds grace_period);

// After a run that the signal ended: requeues the job and returns true, saying so through `log`
// first (Slurm ends this process as it requeues), or says through `log` why not and returns false.
bool requeue_after_finish(const RequeuePolicy& policy, const Environment& env, const std::function<void(const std::string&)>& log);

}  // namespace ddl::launcher
