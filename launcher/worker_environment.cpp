#include "launcher/worker_environment.hpp"

#include <algorithm>

#include "common/worker_contract.hpp"

namespace ddl::launcher {

int threads_per_worker(int cpus_on_node, int workers_per_node) { return std::max(1, cpus_on_node / std::max(1, workers_per_node)); }

Environment worker_environment(const Environment& base, const WorldPlan& plan, const WorkerSlot& worker, const RunContext& run,
                               const GpuInventory& gpus) {
  Environment env = base;
  const int on_this_node = plan.workers_on(worker.node_rank);
  auto set = [&env](const std::string& name, const auto& value) {
    if constexpr (std::is_convertible_v<decltype(value), std::string>)
      env[name] = value;
    else
      env[name] = std::to_string(value);
  };
  set(contract::kRank, worker.rank);
  set(contract::kSize, plan.world_size());
  set(contract::kLocalRank, worker.local_rank);
  set(contract::kLocalSize, on_this_node);
  set(contract::kNodeRank, worker.node_rank);
  set(contract::kNumNodes, plan.num_nodes);
  set(contract::kStoreAddr, run.store_addr);
  set(contract::kStoreToken, run.store_token);
  set(contract::kRunId, run.run_id);

  // torchrun's set: a single role, so role ranks are the global ranks and groups are nodes.
  set("RANK", worker.rank);
  set("WORLD_SIZE", plan.world_size());
  set("LOCAL_RANK", worker.local_rank);
  set("LOCAL_WORLD_SIZE", on_this_node);
  set("GROUP_RANK", worker.node_rank);
  set("GROUP_WORLD_SIZE", plan.num_nodes);
  set("ROLE_RANK", worker.rank);
  set("ROLE_WORLD_SIZE", plan.world_size());
  set("ROLE_NAME", std::string("default"));
  set("MASTER_ADDR", run.master_addr);
  set("MASTER_PORT", run.master_port);
  set("TORCHELASTIC_RUN_ID", run.run_id);
  set("TORCHELASTIC_RESTART_COUNT", run.restart_count);
  set("TORCHELASTIC_MAX_RESTARTS", run.max_restarts);
  // What an enclosing torchrun's agent tells its own workers (ddl run started from one): its store,
  // its watchdog's timer file, its error file. Kept, torch's env:// init joins that agent's store,
  // which nobody serves at this run's MASTER_PORT, and waits for it.
  for (const char* agent_only :
       {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ENABLE_FILE_TIMER", "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_ERROR_FILE"})
    env.erase(agent_only);

  // horovodrun's set, so Horovod-style scripts (and ddl.torch's tests of them) read the same ranks.
  // Cross ranks as Horovod's: among the nodes that have a worker of this local rank (all nodes when
  // every node holds the same number).
  set("HOROVOD_RANK", worker.rank);
  set("HOROVOD_SIZE", plan.world_size());
  set("HOROVOD_LOCAL_RANK", worker.local_rank);
  set("HOROVOD_LOCAL_SIZE", on_this_node);
  set("HOROVOD_CROSS_RANK", plan.cross_rank(worker));
  set("HOROVOD_CROSS_SIZE", plan.cross_size(worker.local_rank));

  if (plan.gpu_workers) set("CUDA_VISIBLE_DEVICES", gpu_for_local_rank(gpus, worker.local_rank));
  // An empty OMP_NUM_THREADS (`export OMP_NUM_THREADS=$UNSET_VAR`) is no setting to OpenMP, which then
  // gives every worker all the node's cores: the default applies to it as to an unset one.
  if (const auto omp = env.find("OMP_NUM_THREADS"); omp == env.end() || omp->second.empty())
    set("OMP_NUM_THREADS", threads_per_worker(run.cpus_on_node, on_this_node));
  // Output goes through a pipe; without this Python holds a worker's prints until it exits. Python
  // reads an empty PYTHONUNBUFFERED as unset, so it gets the default too.
  if (const auto unbuffered = env.find("PYTHONUNBUFFERED"); unbuffered == env.end() || unbuffered->second.empty())
    set("PYTHONUNBUFFERED", std::string("1"));
  return env;
}

}  // namespace ddl::launcher
