// Batch jobs on the site's scheduler: submit a script, ask how a job is, follow it, cancel it.
// Slurm through sbatch/squeue/scancel, PBS through qsub/qstat/qdel. Backends never print.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/scheduler.hpp"

namespace ddl::backends {

struct JobState {
  std::string id;
  std::string name;    // PBS only: a Slurm job name may hold any text, and nothing shows it
  std::string state;   // the scheduler's word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (PBS: Q, R, F, ...)
  std::string reason;  // why it is pending, or how it ended
  std::string nodes;   // where it runs
  std::string output;  // its output file, when the scheduler says (Slurm: the file its batch step writes)
  std::optional<int> exit_code;
  bool finished = false;
  bool vanished = false;  // follow_job: the scheduler stopped listing the job before it was seen to end
};

// The scheduler whose tools are on PATH (Slurm first); throws when neither is.
Scheduler local_scheduler();

// Submits `script` (on the tool's stdin, so no file is written) and returns the job id. Throws
// ddl::Error carrying the scheduler's own message when it refuses the job, or when the tool could
// not reach the scheduler at all (then saying that nothing was submitted).
std::string submit_job(Scheduler scheduler, const std::string& script);

// Whether sbatch's or qsub's output `said` means it reached no controller/server.
bool scheduler_unreachable(const std::string& said);

// The jobs in `qstat -f -F json`'s output (none without a "Jobs" field); throws an Error where it is
// not such a document. OpenPBS writes a
// value of digits alone as a JSON number (a job named 42), so fields are read as text whatever
// their JSON type, and an entry that is no object is skipped. With an `owner`, only the jobs whose
// Job_Owner is that user (Job_Owner is "user@submit-host").
std::vector<JobState> pbs_jobs_from_qstat_json(const std::string& qstat_json, const std::string& owner = "");

// How job `id` is now; nullopt when the scheduler no longer knows it.
std::optional<JobState> job_state(Scheduler scheduler, const std::string& id);

// The current user's jobs (each element of an array on its own).
std::vector<JobState> my_jobs(Scheduler scheduler);

// The elements of job array `id` as they are now (Slurm: "123_0", ...; PBS: "123[0].server", ...).
std::vector<JobState> array_elements(Scheduler scheduler, const std::string& id);

// Polls array `id` until every element ended or `timeout` passes, calling `on_change` whenever an
// element's state, reason or nodes change; returns the elements once all ended, else nullopt.
std::optional<std::vector<JobState>> follow_array(Scheduler scheduler, const std::string& id, std::chrono::seconds timeout,
                                                  const std::function<void(const JobState&)>& on_change);

// What a job that ended exits with, as `ddl submit --wait` reports it: its exit code; 1 where it
// did not complete (cancelled while pending, a node failure: Slurm says exit code 0:0 for those)
// or where its end is unknown.
int ended_job_exit_code(const JobState& job);

// Cancels job `id`: true when cancelled, false when it was already ending or had ended (Slurm:
// "already completing or completed"); throws ddl::Error with the scheduler's message when it cannot.
bool cancel_job(Scheduler scheduler, const std::string& id);

// Puts Slurm job `id` back in the queue (scontrol requeue), which ends its running start at once;
// throws ddl::Error with Slurm's message when it cannot.
void requeue_slurm_job(const std::string& id);

// Whether Slurm job `id` is a batch job (squeue's BatchFlag), which `scontrol requeue` takes, and
// not an interactive allocation (salloc); nullopt when Slurm does not say.
std::optional<bool> slurm_job_is_batch(const std::string& id);

// How long Slurm job `id` may still run (squeue's time left); nullopt when Slurm does not say
// (no limit, an unknown job, no squeue).
std::optional<std::chrono::seconds> slurm_time_left(const std::string& id);

// Whether `now` differs from `before` in what a status line shows (state, reason, nodes).
bool shows_change(const std::optional<JobState>& before, const JobState& now);

// Polls job `id` until it ends or `timeout` passes, calling `on_change` whenever its state,
// reason or nodes change; returns the last state seen.
std::optional<JobState> follow_job(Scheduler scheduler, const std::string& id, std::chrono::seconds timeout,
                                   const std::function<void(const JobState&)>& on_change);

// A job id as the scheduler writes one ("123", "123_4", "123.pbs01"); anything else is refused
// before it reaches a command line.
bool looks_like_job_id(const std::string& id);
// "'<id>' is not a job id", with an id of over 64 characters cut short (and its length said).
std::string not_a_job_id(const std::string& id);

}  // namespace ddl::backends
