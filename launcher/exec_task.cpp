#include "launcher/exec_task.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"
#include "launcher/host.hpp"
#include "launcher/worker_environment.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

bool planned_gpu_workers(const Environment& env, const ExecRequest& request, const GpuInventory& gpus) {
  if (request.cpu_only) return false;
  if (auto planned = lookup(env, "DDL_GPU_WORKERS")) return *planned == "1";
  return gpus.count() > 0;
}

// The cores this node gives the run: what the launcher gave each task times the tasks here.
int cpus_for_node(const Environment& env, int local_size) {
  for (const char* per_task : {"DDL_CPUS_PER_TASK", "SLURM_CPUS_PER_TASK", "PALS_DEPTH"}) {
    auto value = lookup(env, per_task);
    if (value && std::atoi(value->c_str()) > 0) return std::atoi(value->c_str()) * local_size;
  }
  return available_cpus();
}

// The scheduler's name for this run when ddl run did not name it.
std::string run_id_of(const Environment& env) {
  if (auto id = lookup(env, "DDL_RUN_ID")) return *id;
  if (auto job = lookup(env, "SLURM_JOB_ID")) return fmt::format("{}.{}", *job, lookup(env, "SLURM_STEP_ID").value_or("0"));
  if (auto job = lookup(env, "PBS_JOBID")) return *job;
  return "ddl-exec";
}

}  // namespace

Environment task_environment(const Environment& env, const TaskIdentity& id, const ExecRequest& request, const GpuInventory& gpus) {
  WorldPlan plan;
  plan.num_nodes = id.num_nodes;
  plan.workers_per_node = id.local_size;
  plan.gpu_workers = planned_gpu_workers(env, request, gpus);
  if (plan.gpu_workers && gpus.count() == 0)
    throw UsageError(fmt::format("rank {} on {} should get a GPU, but none is visible there ({})", id.rank, host_name(), gpus.source),
                     "ask the scheduler for GPUs on every node (--gpus-per-node), or run CPU workers with ddl run --cpu");
  const GpuInventory order = in_order(gpus, request.gpu_order);

  RunContext run;
  run.run_id = run_id_of(env);
  run.store_addr = lookup(env, "DDL_STORE_ADDR").value_or("");
  run.store_token = lookup(env, "DDL_STORE_TOKEN").value_or("");
  run.master_addr = lookup(env, "MASTER_ADDR").value_or("");
  run.cpus_on_node = cpus_for_node(env, id.local_size);
  run.restart_count = std::atoi(lookup(env, "TORCHELASTIC_RESTART_COUNT").value_or("0").c_str());
  run.max_restarts = std::atoi(lookup(env, "TORCHELASTIC_MAX_RESTARTS").value_or("0").c_str());
  const WorkerSlot slot{id.rank, id.local_rank, id.node_rank};
  Environment result = worker_environment(env, plan, slot, run, order);
  // What only ddl run knows is passed through as it came, or left unset.
  for (const char* name : {"DDL_STORE_ADDR", "DDL_STORE_TOKEN", "MASTER_ADDR", "MASTER_PORT"}) {
    if (auto inherited = lookup(env, name))
      result[name] = *inherited;
    else
      result.erase(name);
  }
  result.erase("DDL_GPU_WORKERS");
  result.erase("DDL_CPUS_PER_TASK");
  return result;
}

void exec_task(const ExecRequest& request, const Environment& env) {
  if (request.command.empty())
    throw UsageError("ddl exec: no program to run", "put the program after --: srun ddl exec -- python train.py");
  const TaskIdentity id = task_identity(env);
  const GpuInventory gpus = request.cpu_only ? GpuInventory{{}, "--cpu"} : discover_gpus(env);
  const Environment task_env = task_environment(env, id, request, gpus);
  const std::string program = resolve_program(request.command.front(), lookup(task_env, "PATH").value_or("/usr/bin:/bin"));

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
