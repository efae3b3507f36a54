// Inside a Slurm allocation: what it holds, and the srun line that starts one task per worker.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "backends/launch_layout.hpp"
#include "common/environment.hpp"

namespace ddl::backends::slurm {

// The host names of a Slurm node list ("nid[001-003],gpu7"), expanded by `scontrol show hostnames`
// (a plain single name is returned as it is, without asking scontrol).
std::vector<std::string> expand_hostlist(const std::string& nodelist);

// GPUs per node the allocation holds: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE ("a100:4"),
// else the entries of SLURM_JOB_GPUS; 0 when it holds none.
int gpus_per_node(const Environment& env);

// CPUs per node: SLURM_CPUS_ON_NODE, else the first count of SLURM_JOB_CPUS_PER_NODE ("64(x2)").
int cpus_per_node(const Environment& env);

// Tasks per node of the allocation, one entry per node: SLURM_TASKS_PER_NODE ("2(x3),1" ->
// 2,2,2,1), else SLURM_NTASKS_PER_NODE for each of `num_nodes`; empty when neither is set or
// readable. What srun would start, and so what `ddl run` starts for CPU workers with no count.
std::vector<int> tasks_per_node(const Environment& env, int num_nodes);

// Whether this Slurm's srun offers --mpi=pmix (`srun --mpi=list`).
bool srun_offers_pmix();

// srun --nodes N --ntasks-per-node T --cpus-per-task C --kill-on-bad-exit=1 --export=ALL --label [--mpi=PLUGIN] TASK...
// (no --mpi when `mpi_plugin` is empty).
std::vector<std::string> srun_command(const TaskLayout& layout, const std::string& mpi_plugin);

struct FailedTask {
  int rank = 0;
  std::string host;
  std::string how;    // srun's words: "Exited with exit code 7", "Killed"
  int exit_code = 0;  // the task's exit status, or 128 + signal
  int signal = 0;     // the signal that killed it, 0 when it exited
};

// The step ("12.3") that the srun of process id `srun_pid` started, read from `scontrol -o show
// step` output (its "SrunHost:Pid=HOST:PID" field): the one on `host`, else the only step of an srun
// of that pid (Slurm may name this host otherwise); nothing when several other hosts' match.
std::optional<std::string> step_of_srun(const std::string& scontrol_steps, long srun_pid, const std::string& host);

// The step that srun process `srun_pid` on `host` (this host's name) started in job `job_id`,
// asked of Slurm (`scontrol -o show step JOB`); nothing when Slurm did not say.
std::optional<std::string> srun_step(const std::string& job_id, long srun_pid, const std::string& host);

// Sends `sig` to every task of `step` through Slurm (`scancel --signal`). srun itself answers
// SIGTERM by killing its tasks at once; this leaves them their handlers. False when scancel failed.
bool signal_step(const std::string& step, int sig);

// The first task srun reported as failed ("srun: error: HOST: task 1: Exited with exit code 7").
std::optional<FailedTask> failed_task(const std::deque<std::string>& srun_stderr);

}  // namespace ddl::backends::slurm
