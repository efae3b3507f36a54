#include "launcher/world_plan.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl::launcher {

int WorldPlan::workers_on(int node_rank) const { return uniform() ? workers_per_node : node_sizes.at(static_cast<size_t>(node_rank)); }

int WorldPlan::first_rank_on(int node_rank) const {
  if (uniform()) return node_rank * workers_per_node;
  int first = 0;
  for (int n = 0; n < node_rank; ++n) first += workers_on(n);
  return first;
}

int WorldPlan::world_size() const { return first_rank_on(num_nodes); }

WorkerSlot WorldPlan::slot(int rank) const {
  if (uniform()) return {rank, rank % workers_per_node, rank / workers_per_node};
  int node = 0, first = 0;
  while (node + 1 < num_nodes && rank >= first + workers_on(node)) first += workers_on(node++);
  return {rank, rank - first, node};
}

std::vector<WorkerSlot> WorldPlan::slots_on_node(int node_rank) const {
  std::vector<WorkerSlot> slots;
  const int first = first_rank_on(node_rank);
  for (int local = 0; local < workers_on(node_rank); ++local) slots.push_back({first + local, local, node_rank});
  return slots;
}

int WorldPlan::cross_size(int local_rank) const {
  int nodes = 0;
  for (int n = 0; n < num_nodes; ++n) nodes += workers_on(n) > local_rank ? 1 : 0;
  return nodes;
}

int WorldPlan::cross_rank(const WorkerSlot& worker) const {
  int before = 0;
  for (int n = 0; n < worker.node_rank; ++n) before += workers_on(n) > worker.local_rank ? 1 : 0;
  return before;
}

WorldPlan plan_with_node_sizes(const std::vector<int>& sizes, bool gpu_workers) {
  WorldPlan plan;
  plan.num_nodes = static_cast<int>(sizes.size());
  plan.workers_per_node = *std::max_element(sizes.begin(), sizes.end());
  plan.gpu_workers = gpu_workers;
  if (std::any_of(sizes.begin(), sizes.end(), [&](int s) { return s != sizes.front(); })) plan.node_sizes = sizes;
  return plan;
}

namespace {

void require_positive(const std::optional<int>& value, const char* flag) {
  if (value && *value < 1) throw UsageError(fmt::format("{} must be at least 1, not {}", flag, *value));
}

// Workers per node from the flags that say it directly; nullopt when none does.
std::optional<int> explicit_workers_per_node(const LaunchRequest& r) {
  if (r.workers_per_node && r.gpus_per_node && *r.workers_per_node != *r.gpus_per_node)
    throw UsageError(fmt::format("--nproc-per-node {} contradicts --gpus-per-node {}", *r.workers_per_node, *r.gpus_per_node),
                     "give one of them: each GPU gets one worker");
  if (r.gpus_per_node) return r.gpus_per_node;
  return r.workers_per_node;
}

int workers_per_node_from_total(const LaunchRequest& r, int nodes, std::optional<int> per_node) {
  const int total = *r.total_workers;
  if (per_node) {
    if (total != nodes * *per_node)
      throw UsageError(fmt::format("-np {} contradicts {} node(s) x {} workers per node", total, nodes, *per_node),
                       "give -np alone, or -N with --nproc-per-node/--gpus-per-node");
    return *per_node;
  }
  if (total % nodes != 0) {
    if (!r.nodes_from.empty())
      throw UsageError(fmt::format("-np {} does not divide evenly over the {} nodes of {}", total, nodes, r.nodes_from),
                       fmt::format("use a multiple of {}, or give -N with a count it divides by", nodes));
    throw UsageError(fmt::format("-np {} does not divide evenly over -N {} nodes", total, nodes),
                     "use a multiple of the node count, or --nproc-per-node");
  }
  return total / nodes;
}

}  // namespace

bool wants_gpu_workers(const LaunchRequest& r, int gpus_on_node) {
  return !r.cpu_only && (r.gpus_per_node.has_value() || gpus_on_node > 0);
}

WorldPlan plan_world(const LaunchRequest& r, int gpus_on_node) {
  require_positive(r.num_nodes, "-N/--nodes");
  require_positive(r.total_workers, "-np");
  require_positive(r.workers_per_node, "--nproc-per-node");
  require_positive(r.gpus_per_node, "--gpus-per-node");
  if (r.cpu_only && r.gpus_per_node) throw UsageError("--cpu contradicts --gpus-per-node", "use --nproc-per-node for CPU workers");

  WorldPlan plan;
  plan.num_nodes = r.num_nodes.value_or(1);
  std::optional<int> per_node = explicit_workers_per_node(r);
  if (r.total_workers) per_node = workers_per_node_from_total(r, plan.num_nodes, per_node);
  // With no count at all: one worker per GPU, or a single worker on a machine without GPUs.
  plan.workers_per_node = per_node.value_or(!r.cpu_only && gpus_on_node > 0 ? gpus_on_node : 1);
  plan.gpu_workers = wants_gpu_workers(r, gpus_on_node);

  if (plan.gpu_workers && gpus_on_node == 0)
    throw UsageError(fmt::format("--gpus-per-node {} but this node has no GPU visible", *r.gpus_per_node),
                     "check CUDA_VISIBLE_DEVICES and nvidia-smi, or use --nproc-per-node for CPU workers");
  if (plan.gpu_workers && plan.workers_per_node > gpus_on_node && !r.share_gpus)
    throw UsageError(fmt::format("{} GPU workers per node but this node has {} GPU(s)", plan.workers_per_node, gpus_on_node),
                     "run fewer workers, add --share-gpus to put several workers on one GPU, or --cpu for CPU workers");
  return plan;
}

}  // namespace ddl::launcher
