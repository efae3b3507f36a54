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
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGHUP})
    if (upper == ::sigabbrev_np(sig)) return sig;
  throw UsageError(fmt::format("{} {}: not a signal ddl can requeue on", flag, name),
                   fmt::format("give USR1 (the usual), USR2, TERM or HUP"));
}

int requeue_count(const Environment& env) {
  return static_cast<int>(whole_number(lookup(env, "SLURM_RESTART_COUNT").value_or("0"), INT_MAX).value_or(0));
}

FinishRequest finish_request(const RequeuePolicy& policy, const Environment& env, std::chrono::milliseconds grace_period) {
  const std::string job = slurm_job_id(env);
  if (job.empty())
    throw UsageError("--requeue-signal requeues a Slurm batch job, and this is not one (SLURM_JOB_ID is unset)",
                     "use it in the job's script, as `ddl submit --requeue` writes it, or drop it");
  FinishRequest request{.signal = policy.signal, .wait = policy.grace.value_or(kRequeueGraceWithoutLimit)};
  if (policy.grace) return request;
  if (const auto left = backends::slurm_time_left(job)) {
    // Until shortly before the limit, and at least a second.
    const auto now = std::chrono::steady_clock::now();
    request.latest = std::max(now + std::chrono::seconds(1), now + *left - grace_period - kRequeueMargin);
    request.wait = std::chrono::hours(24 * 365);
  }
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
