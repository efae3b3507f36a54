// The environment every worker starts with: DESIGN.md section 4, the fixed contract.
#pragma once

#include <cstdint>
#include <string>

#include "common/environment.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/world_plan.hpp"

namespace ddl::launcher {

// What is the same for every worker of one run.
struct RunContext {
  std::string run_id;        // DDL_RUN_ID, TORCHELASTIC_RUN_ID
  std::string store_addr;    // DDL_STORE_ADDR, host:port
  std::string store_token;   // DDL_STORE_TOKEN
  std::string master_addr;   // MASTER_ADDR: node 0
  uint16_t master_port = 0;  // MASTER_PORT: reserved free on node 0
  int cpus_on_node = 1;      // cores this node gives the run, for OMP_NUM_THREADS
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT: how many times the workers were restarted
  int max_restarts = 0;      // TORCHELASTIC_MAX_RESTARTS: --max-restarts
};

// `base` (the launcher's own environment) with the contract variables of `worker` set over it.
// OMP_NUM_THREADS and PYTHONUNBUFFERED are set only where `base` does not set them already.
Environment worker_environment(const Environment& base, const WorldPlan& plan, const WorkerSlot& worker, const RunContext& run,
                               const GpuInventory& gpus);

// Threads per worker: the node's cores shared among its workers, at least 1.
int threads_per_worker(int cpus_on_node, int workers_per_node);

}  // namespace ddl::launcher
