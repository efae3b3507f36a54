#include "launcher/exec_task.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/worker_contract.hpp"
#include "common/write_all.hpp"
#include "launcher/end_by_signal.hpp"
#include "launcher/host.hpp"
#include "launcher/relayed_output.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/worker_environment.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

constexpr int kMostNodesListed = 1 << 16;

bool planned_gpu_workers(const Environment& env, const ExecRequest& request, const GpuInventory& gpus) {
  if (request.cpu_only) return false;
  if (auto planned = lookup(env, "DDL_GPU_WORKERS")) return *planned == "1";
  return gpus.count() > 0;
}

// The cores this node gives the run: what the launcher gave each task times the tasks here.
int cpus_for_node(const Environment& env, int local_size) {
  constexpr long long kMostCpus = 1 << 20;
  for (const char* per_task : {"DDL_CPUS_PER_TASK", "SLURM_CPUS_PER_TASK", "PALS_DEPTH"}) {
    // Not a count (atoi would wrap "99999999999" around): as if unset.
    const auto count = whole_number(lookup(env, per_task).value_or(""), kMostCpus);
    if (count && *count > 0) return static_cast<int>(std::min(*count * local_size, kMostCpus));
  }
  return available_cpus();
}

// The nodes' task counts: Slurm's list of them when srun started the task (it may hold nodes of
// different sizes: srun -n 5 over two nodes runs 3 and 2), else the same on each (local_size).
WorldPlan task_plan(const Environment& env, const TaskIdentity& id) {
  WorldPlan uniform;
  uniform.num_nodes = id.num_nodes;
  uniform.workers_per_node = id.local_size;
  auto listed = lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!listed) listed = lookup(env, "SLURM_TASKS_PER_NODE");
  if (!listed || !id.source.starts_with("Slurm") || id.num_nodes > kMostNodesListed || id.node_rank < 0 || id.node_rank >= id.num_nodes)
    return uniform;
  std::vector<int> sizes;
  try {
    sizes = tasks_on_nodes(*listed, id.num_nodes);
  } catch (const UsageError&) {
    return uniform;
  }
  const long long total = std::accumulate(sizes.begin(), sizes.end(), 0LL);
  if (total != id.size || sizes[static_cast<size_t>(id.node_rank)] != id.local_size) return uniform;
  return plan_with_node_sizes(sizes, false);
}

// The scheduler's name for this run when ddl run did not name it.
std::string run_id_of(const Environment& env) {
  if (auto id = lookup(env, contract::kRunId)) return *id;
  if (auto job = lookup(env, "SLURM_JOB_ID")) return fmt::format("{}.{}", *job, lookup(env, "SLURM_STEP_ID").value_or("0"));
  if (auto job = lookup(env, "PBS_JOBID")) return *job;
  return "ddl-exec";
}

// Under srun, slurmstepd (this task's parent) signals every process of the task itself.
SupervisorOptions relay_options(const ExecRequest& request, const TaskIdentity& id) {
  SupervisorOptions options;
  options.grace_period = request.grace_period;
  options.hang_timeout = request.hang_timeout;
  options.host = host_name();
  options.relay_with_rank_labels = true;
  options.parent_signals_workers = id.source.starts_with("Slurm");
  // ddl run keeps the deadline; this supervisor only notes that the signal came (Run's finished_on).
  if (request.finish_signal)
    options.finish_on =
        FinishRequest{*request.finish_signal, [](std::chrono::steady_clock::time_point now) { return now + std::chrono::hours(24 * 365); }};
  return options;
}

// Ends as the worker of `rank` ended: returns its exit code, or dies of the signal that killed it.
int end_as_worker(const RunOutcome& outcome, int rank) {
  auto status = outcome.wait_status.find(rank);
  if (status == outcome.wait_status.end()) return outcome.exit_code;         // never reaped: cannot happen once run() returned
  if (WIFSIGNALED(status->second)) end_by_signal(WTERMSIG(status->second));  // as the program it ran ended
  return WEXITSTATUS(status->second);
}

}  // namespace

Environment task_environment(const Environment& env, const TaskIdentity& id, const ExecRequest& request, const GpuInventory& gpus) {
  WorldPlan plan = task_plan(env, id);
  plan.gpu_workers = planned_gpu_workers(env, request, gpus);
  if (plan.gpu_workers && gpus.count() == 0)
    throw UsageError(fmt::format("rank {} on {} should get a GPU, but none is visible there ({})", id.rank, host_name(), gpus.source),
                     "ask the scheduler for GPUs on every node (--gpus-per-node), or run CPU workers with ddl run --cpu");
  // ddl run planned a GPU per worker: more tasks here than the GPUs each sees would put two on one
  // GPU (NCCL refuses that), unless it was told --share-gpus. A task that sees one GPU (srun
  // --gpus-per-task=1) has its own. A task srun started without ddl run may hold GPUs of its own
  // (--gpus-per-task=2), which its visible count cannot tell from shared ones: not checked.
  const bool planned_by_ddl_run = lookup(env, "DDL_GPU_WORKERS").has_value();
  if (planned_by_ddl_run && plan.gpu_workers && gpus.count() > 1 && id.local_rank >= gpus.count() &&
      lookup(env, "DDL_SHARE_GPUS").value_or("0") != "1")
    throw UsageError(fmt::format("local rank {} on {} would share a GPU: {} task(s) there see the same {} GPU(s) ({})", id.local_rank,
                                 host_name(), id.local_size, gpus.count(), gpus.source),
                     "give each task its own GPU (srun --gpus-per-task=1), start as many tasks per node as GPUs, or put several "
                     "workers on one GPU on purpose with ddl run --share-gpus");
  const GpuInventory order = in_order(gpus, request.gpu_order);

  RunContext run;
  run.run_id = run_id_of(env);
  run.store_addr = lookup(env, contract::kStoreAddr).value_or("");
  run.store_token = lookup(env, contract::kStoreToken).value_or("");
  run.master_addr = lookup(env, "MASTER_ADDR").value_or("");
  run.cpus_on_node = cpus_for_node(env, id.local_size);
  // torchrun's counts, as ddl run set them; anything else is 0 (atoi would wrap 99999999999 around).
  run.restart_count = static_cast<int>(whole_number(lookup(env, "TORCHELASTIC_RESTART_COUNT").value_or("0"), INT_MAX).value_or(0));
  run.max_restarts = static_cast<int>(whole_number(lookup(env, "TORCHELASTIC_MAX_RESTARTS").value_or("0"), INT_MAX).value_or(0));
  const WorkerSlot slot{id.rank, id.local_rank, id.node_rank};
  Environment result = worker_environment(env, plan, slot, run, order);
  // What only ddl run knows is passed through as it came, or left unset.
  for (const char* name : {contract::kStoreAddr, contract::kStoreToken, "MASTER_ADDR", "MASTER_PORT"}) {
    if (auto inherited = lookup(env, name))
      result[name] = *inherited;
    else
      result.erase(name);
  }
  // Nodes of different sizes that the launcher does not list (mpirun -np 5 over 4 + 1 slots): the
  // world's size is still the launcher's; cross ranks stay counted by node.
  if (plan.world_size() != id.size)
    for (const char* name : {contract::kSize, "WORLD_SIZE", "ROLE_WORLD_SIZE", "HOROVOD_SIZE"}) result[name] = std::to_string(id.size);
  result.erase("DDL_GPU_WORKERS");
  result.erase("DDL_SHARE_GPUS");
  result.erase("DDL_CPUS_PER_TASK");
  return result;
}

int exec_task(const ExecRequest& request, const Environment& env) {
  if (request.command.empty())
    throw UsageError("ddl exec: no program to run", "put the program after --: srun ddl exec -- python train.py");
  const TaskIdentity id = task_identity(env);
  // With --relay, the supervisor blocks the signals it takes before anything could start a thread
  // (counting GPUs may start the CUDA driver's), so that no thread takes them instead.
  std::optional<Supervisor> relay;
  if (request.relay_output) relay.emplace(relay_options(request, id));
  const GpuInventory gpus = request.cpu_only ? GpuInventory{{}, "--cpu"} : discover_gpus(env);
  const Environment task_env = task_environment(env, id, request, gpus);
  const std::string program = resolve_program(request.command.front(), lookup(task_env, "PATH").value_or("/usr/bin:/bin"));
  if (relay) {
    const RunOutcome outcome = relay->run({WorkerLaunch{id.rank, program, request.command, task_env}});
    // A signal that came after the worker ended would act once the mask is given back: dropped.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_IGN);
    relay.reset();
    // After a stop signal (ddl run's, through Slurm) or the finish signal the task ends with 0
    // however the program ended, so that srun's --kill-on-bad-exit does not kill the ranks still
    // saving; a relayed line tells ddl run how it ended (a failure unless ddl run is stopping or
    // finishing the run itself). A failure before the signal is the task's.
    const int signalled = outcome.finished_on ? outcome.finished_on : outcome.interrupted_by;
    if (signalled && !outcome.failure) {
      const int status = outcome.wait_status.count(id.rank) ? outcome.wait_status.at(id.rank) : 0;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
      write_all(STDOUT_FILENO, relayed_end(id.rank, status));
      if (outcome.finished_on)
        std::fprintf(stderr,
                     "ddl exec: rank %d's program ended after SIG%s (the requeue signal) with %s; the task ends with 0, so that "
                     "srun does not stop the ranks still saving\n",
                     id.rank, ::sigabbrev_np(outcome.finished_on),
                     WIFSIGNALED(status) ? fmt::format("SIG{}", ::sigabbrev_np(WTERMSIG(status))).c_str()
                                         : fmt::format("exit code {}", WEXITSTATUS(status)).c_str());
      return 0;
    }
    return end_as_worker(outcome, id.rank);
  }

  std::vector<std::string> envp = to_envp(task_env);
  std::vector<char*> argv_ptrs, env_ptrs;
  for (const auto& a : request.command) argv_ptrs.push_back(const_cast<char*>(a.c_str()));
  argv_ptrs.push_back(nullptr);
  for (auto& e : envp) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);
  ::execve(program.c_str(), argv_ptrs.data(), env_ptrs.data());
  throw ProgramNotRunnable(fmt::format("ddl exec: cannot run {}: {}", program, std::strerror(errno)));
}

}  // namespace ddl::launcher
