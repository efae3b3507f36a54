// The shape of a run: how many nodes, how many workers on each, and which rank each worker is.
#pragma once

#include <optional>
#include <vector>

namespace ddl::launcher {

// What the user asked for on the command line; unset fields are derived.
struct LaunchRequest {
  std::optional<int> num_nodes;         // -N, --nodes
  std::optional<int> total_workers;     // -np, -n, --np
  std::optional<int> workers_per_node;  // --nproc-per-node
  std::optional<int> gpus_per_node;     // --gpus-per-node: that many GPU workers per node
  bool cpu_only = false;                // --cpu: workers get no GPU
  bool share_gpus = false;              // --share-gpus: more GPU workers than GPUs, round robin
};

struct WorkerSlot {
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
};

struct WorldPlan {
  int num_nodes = 1;
  int workers_per_node = 1;
  bool gpu_workers = false;  // each worker is pinned to a GPU by its local rank

  int world_size() const { return num_nodes * workers_per_node; }
  // Ranks are node-major: node n holds ranks n*workers_per_node .. (n+1)*workers_per_node-1.
  WorkerSlot slot(int rank) const;
  std::vector<WorkerSlot> slots_on_node(int node_rank) const;
};

// Derives the plan from the request and the GPUs this node has; throws UsageError naming the
// flags when they contradict each other or ask for more GPUs than there are.
WorldPlan plan_world(const LaunchRequest& request, int gpus_on_node);

}  // namespace ddl::launcher
