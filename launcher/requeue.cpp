#include "launcher/requeue.hpp"

#include <string.h>

#include <algorithm>
#include <cctype>
#include <climits>

#include <fmt/format.h>

#include "backends/jobs.hpp"
#include "common/error.hpp"

namespace ddl::launcher {

namespace {

std::string slurm_job_id(const Environment& env) { return lookup(env, "SLURM_JOB_ID").value_or(""); }

}  // namespace

int requeue_signal_named(const std::string& name, const std::string& flag) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper.starts_with("SIG")) upper = upper.substr(3);
  for (int sig : {SIGUSR1, SIGUSR2})
    if (upper == ::sigabbrev_np(sig)) return sig;
  throw UsageError(fmt::format("{} '{}': only USR1 or USR2 can be used here (srun would end every task on TERM or HUP)", flag, name),
                   "give USR1 (the usual) or USR2");
}

HeldSignal::HeldSignal(int signal) : signal_(signal) {
  sigset_t held;
  sigemptyset(&held);
  sigaddset(&held, signal_);
  ::pthread_sigmask(SIG_BLOCK, &held, &original_);
}

HeldSignal::~HeldSignal() {
  ::signal(signal_, SIG_IGN);  // discards one pending, which would otherwise end ddl now
  ::pthread_sigmask(SIG_SETMASK, &original_, nullptr);
}

int requeue_count(const Environment& env) {
  return static_cast<int>(whole_number(lookup(env, "SLURM_RESTART_COUNT").value_or("0"), INT_MAX).value_or(0));
}

FinishRequest finish_request(const RequeuePolicy& policy, const Environment& env, std::chrono::milliseconds grace_period) {
  const std::string job = slurm_job_id(env);
  if (job.empty())
    throw UsageError("--requeue-signal requeues a Slurm batch job, and this is not one (SLURM_JOB_ID is unset)",
                     "use it in the job's script, as `ddl submit --requeue` writes it, or drop it");
  // Said now rather than when the signal comes, near the time limit: scontrol requeue refuses salloc's jobs.
  if (backends::slurm_job_is_batch(job) == false)
    throw UsageError(fmt::format("--requeue-signal requeues a Slurm batch job, and job {} is an interactive allocation (salloc), "
                                 "which Slurm does not requeue",
                                 job),
                     "use it in a batch job's script, as `ddl submit --requeue` writes it, or drop it");
  FinishRequest request{.signal = policy.signal};
  request.deadline = [grace = policy.grace, job, grace_period](std::chrono::steady_clock::time_point now) {
    // The time limit may have changed since the start (scontrol update): asked when the signal comes.
    const std::optional<std::chrono::seconds> left = backends::slurm_time_left(job);
    if (!left) return now + grace.value_or(kRequeueGraceWithoutLimit);
    const auto before_limit = now + *left - grace_period - kRequeueMargin;
    return std::max(grace ? std::min(now + *grace, before_limit) : before_limit, now + kLeastRequeueGrace);
  };
  return request;
}

bool requeue_after_finish(const RequeuePolicy& policy, const Environment& env, const std::function<void(const std::string&)>& log) {
  const std::string job = slurm_job_id(env);
  const int done = requeue_count(env);
  if (done >= policy.max_requeues) {
    log(fmt::format("job {} is not requeued: it has been requeued {} time(s), as many as --max-requeues {} allows", job, done,
                    policy.max_requeues));
    return false;
  }
  log(fmt::format("requeueing job {} (requeue {} of {}); its next start continues with DDL_REQUEUE_COUNT={}", job, done + 1,
                  policy.max_requeues, done + 1));
  try {
    backends::requeue_slurm_job(job);
  } catch (const Error& e) {
    log(fmt::format("error: {} ({})", e.what(), e.hint()));
    return false;
  }
  return true;
}

}  // namespace ddl::launcher
