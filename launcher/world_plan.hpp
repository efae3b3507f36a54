// The shape of a run: how many nodes, how many workers on each, and which rank each worker is.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddl::launcher {

// What the user asked for on the command line; unset fields are derived.
struct LaunchRequest {
  std::optional<int> num_nodes;         // -N, --nodes
  std::string nodes_from;               // where num_nodes came from when not -N ("Slurm job 5"), for messages
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

// The most workers one run can have (ddl run -H refuses more; a host's agent checks its job too).
constexpr int kMostWorkers = 1 << 24;

struct WorldPlan {
  int num_nodes = 1;
  int workers_per_node = 1;  // on every node; with node_sizes, the most on any node
  bool gpu_workers = false;  // each worker is pinned to a GPU by its local rank
  // Nodes of different sizes (-H a:4,b:2; srun -n 5 over two nodes): node n holds node_sizes[n]
  // workers. Empty when every node holds workers_per_node.
  std::vector<int> node_sizes;

  bool uniform() const { return node_sizes.empty(); }
  int workers_on(int node_rank) const;
  int first_rank_on(int node_rank) const;
  int world_size() const;
  // Ranks are node-major: node n holds ranks first_rank_on(n) .. first_rank_on(n)+workers_on(n)-1.
  WorkerSlot slot(int rank) const;
  std::vector<WorkerSlot> slots_on_node(int node_rank) const;
  // Horovod's cross communicator: the workers of one local rank, one per node that has it.
  int cross_size(int local_rank) const;
  int cross_rank(const WorkerSlot& worker) const;
};

// A plan whose node n holds sizes[n] workers (uniform when they are all equal); sizes not empty,
// each at least 1.
WorldPlan plan_with_node_sizes(const std::vector<int>& sizes, bool gpu_workers);

// Whether the workers are GPU workers (each pinned to a GPU by its local rank): --gpus-per-node
// says so, --cpu says not, and otherwise a node with GPUs gets GPU workers.
bool wants_gpu_workers(const LaunchRequest& request, int gpus_on_node);

// Derives the plan from the request and the GPUs this node has; throws UsageError naming the
// flags when they contradict each other or ask for more GPUs than there are.
WorldPlan plan_world(const LaunchRequest& request, int gpus_on_node);

}  // namespace ddl::launcher
