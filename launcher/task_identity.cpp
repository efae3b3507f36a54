#include "launcher/task_identity.hpp"

#include <charconv>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/worker_contract.hpp"

namespace ddl::launcher {

namespace {

// A rank (from 0) or, with `minimum` 1, a count: a task count of 0 would leave no node to be on.
std::optional<int> number_in(const Environment& env, const std::string& name, int minimum = 0) {
  auto value = lookup(env, name);
  if (!value) return std::nullopt;
  int n = -1;
  auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
  if (ec != std::errc() || end != value->data() + value->size() || n < minimum)
    throw UsageError(fmt::format("{}={} is not a {}", name, *value, minimum == 0 ? "rank or count" : "count of 1 or more"),
                     "ddl exec reads it from the launcher that started the task");
  return n;
}

// The first of `names` that is set.
std::optional<int> first_number(const Environment& env, std::initializer_list<const char*> names, int minimum = 0) {
  for (const char* name : names)
    if (auto n = number_in(env, name, minimum)) return n;
  return std::nullopt;
}

// The first of `names` that is set, a count of 1 or more.
std::optional<int> first_count(const Environment& env, std::initializer_list<const char*> names) { return first_number(env, names, 1); }

struct LauncherVariables {
  const char* source{};
  std::initializer_list<const char*> rank, local_rank, size, local_size, node_rank, num_nodes;
};

// Which variables each launcher sets, in the order they are trusted. An mpirun or mpiexec started
// inside a Slurm job passes the batch script's own SLURM_PROCID=0 on to its tasks, so the MPI
// launchers' variables come first; under srun --mpi=pmi2 PMI_RANK and SLURM_PROCID agree.
// OpenMPI's OMPI_COMM_WORLD_NODE_RANK is not a node index (it counts processes on the node across
// jobs), so node ranks come from the block layout.
const LauncherVariables kLaunchers[] = {
    {"OpenMPI (OMPI_COMM_WORLD_RANK)",
     {"OMPI_COMM_WORLD_RANK"},
     {"OMPI_COMM_WORLD_LOCAL_RANK"},
     {"OMPI_COMM_WORLD_SIZE"},
     {"OMPI_COMM_WORLD_LOCAL_SIZE"},
     {},
     {}},
    {"Cray PALS (PALS_RANKID)",
     {"PALS_RANKID"},
     {"PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"},
     {"PMI_SIZE"},
     {"PMI_LOCAL_SIZE"},
     {"PALS_NODEID"},
     {}},
    {"PMI (PMI_RANK)", {"PMI_RANK"}, {"PMI_LOCAL_RANK", "MPI_LOCALRANKID"}, {"PMI_SIZE"}, {"PMI_LOCAL_SIZE", "MPI_LOCALNRANKS"}, {}, {}},
    {"Slurm (SLURM_PROCID)",
     {"SLURM_PROCID"},
     {"SLURM_LOCALID"},
     {"SLURM_NTASKS", "SLURM_NPROCS"},
     {},
     {"SLURM_NODEID"},
     {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}},
    {"PMIx (PMIX_RANK)", {"PMIX_RANK"}, {}, {}, {}, {}, {}},
};

// srun --mpi=pmi2 (a site's MpiDefault) gives its tasks PMI_RANK and PMI_SIZE but no PMI local rank
// or node: Slurm's own variables say those. They are trusted when they describe this same task (a
// rank and size that agree with PMI's): an mpiexec inside a batch script passes on the script's
// SLURM_PROCID=0, which agrees on no rank but 0 and on no size but the job's.
const LauncherVariables* slurm_behind_pmi(const Environment& env, const LauncherVariables* chosen) {
  const LauncherVariables& pmi = kLaunchers[2];
  const LauncherVariables& slurm = kLaunchers[3];
  if (chosen != &pmi || first_number(env, pmi.local_rank)) return chosen;
  const auto slurm_rank = number_in(env, "SLURM_PROCID");
  const auto slurm_size = first_number(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  const bool same_task = slurm_rank && slurm_size && number_in(env, "SLURM_LOCALID") && slurm_rank == number_in(env, "PMI_RANK") &&
                         slurm_size == number_in(env, "PMI_SIZE");
  return same_task ? &slurm : chosen;
}

}  // namespace

namespace {

// Calls `group(count, repeat)` for each group "N" or "N(xR)" of Slurm's comma-separated form, in
// order, until it returns false.
template <typename Group>
void for_each_group(const std::string& tasks_per_node, Group group) {
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string text = tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    // The whole group is read, each number in digits alone and within an int ("4abc" is not 4, nor
    // 99999999999 a count wrapped around).
    const size_t open = text.find("(x");
    constexpr long long most = std::numeric_limits<int>::max();
    const auto count = whole_number(std::string_view(text).substr(0, open), most);
    const auto repeat = open == std::string::npos ? std::optional<long long>(1)
                        : text.ends_with(')')     ? whole_number(std::string_view(text).substr(open + 2, text.size() - open - 3), most)
                                                  : std::nullopt;
    if (!count || !repeat || *count < 1 || *repeat < 1)
      throw UsageError(fmt::format("SLURM_TASKS_PER_NODE={} is not Slurm's N(xR),... form", tasks_per_node), "");
    if (!group(static_cast<int>(*count), static_cast<int>(*repeat)) || comma == std::string::npos) return;
    pos = comma + 1;
  }
}

[[noreturn]] void no_entry_for(const std::string& tasks_per_node, long long node) {
  throw UsageError(fmt::format("SLURM_TASKS_PER_NODE={} has no entry for node {}", tasks_per_node, node), "");
}

}  // namespace

int tasks_on_node(const std::string& tasks_per_node, int node) {
  int first = 0;
  std::optional<int> found;
  for_each_group(tasks_per_node, [&](int count, int repeat) {
    if (node < first + repeat) found = count;
    first += repeat;
    return !found;
  });
  if (!found) no_entry_for(tasks_per_node, node);
  return *found;
}

std::vector<int> tasks_on_nodes(const std::string& tasks_per_node, int nodes) {
  std::vector<int> counts;
  for_each_group(tasks_per_node, [&](int count, int repeat) {
    for (int r = 0; r < repeat && static_cast<int>(counts.size()) < nodes; ++r) counts.push_back(count);
    return static_cast<int>(counts.size()) < nodes;
  });
  if (static_cast<int>(counts.size()) < nodes) no_entry_for(tasks_per_node, static_cast<long long>(counts.size()));
  return counts;
}

TaskIdentity task_identity(const Environment& env) {
  const LauncherVariables* launcher = nullptr;
  for (const auto& l : kLaunchers)
    if (number_in(env, *l.rank.begin())) {
      launcher = &l;
      break;
    }
  if (launcher == nullptr)
    throw UsageError("ddl exec found no rank: none of OMPI_COMM_WORLD_RANK, PALS_RANKID, PMI_RANK, SLURM_PROCID, PMIX_RANK is set",
                     "ddl exec runs inside a task started by srun, mpirun or mpiexec; to start workers use ddl run");
  launcher = slurm_behind_pmi(env, launcher);

  TaskIdentity id;
  id.source = launcher->source;
  id.rank = *first_number(env, launcher->rank);
  const auto planned_size = number_in(env, contract::kSize, 1);
  const auto planned_local_size = number_in(env, contract::kLocalSize, 1);
  const auto planned_nodes = number_in(env, contract::kNumNodes, 1);

  id.size = first_count(env, launcher->size).value_or(planned_size.value_or(1));
  if (planned_size && *planned_size != id.size)
    throw UsageError(fmt::format("{} started {} tasks but ddl run planned {} workers", launcher->source, id.size, *planned_size),
                     "start ddl exec through ddl run, or with the launcher's own counts and without DDL_SIZE set");
  if (id.rank >= id.size)
    throw UsageError(fmt::format("{}: rank {} is not below the world size {}", launcher->source, id.rank, id.size), "");

  auto slurm_tasks = lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!slurm_tasks) slurm_tasks = lookup(env, "SLURM_TASKS_PER_NODE");
  const auto node_from_launcher = first_number(env, launcher->node_rank);
  if (launcher->local_size.size() == 0 && slurm_tasks && node_from_launcher)
    id.local_size = tasks_on_node(*slurm_tasks, *node_from_launcher);
  else
    id.local_size = first_count(env, launcher->local_size).value_or(planned_local_size.value_or(id.size));

  // Without a local rank, ranks are laid out node by node, as ddl run asks of every launcher.
  id.local_rank = first_number(env, launcher->local_rank).value_or(id.rank % id.local_size);
  // A node rank worked out from the rank: nodes of ddl run's planned size, the short one last (mpirun
  // -np 5 over 4 + 1 slots puts rank 4 alone on the second node: node 1, not 4 / its node's 1 task).
  id.node_rank = node_from_launcher.value_or(id.rank / planned_local_size.value_or(id.local_size));
  const auto nodes_of_local_size = static_cast<int>((static_cast<long long>(id.size) + id.local_size - 1) / id.local_size);
  id.num_nodes = first_count(env, launcher->num_nodes).value_or(planned_nodes.value_or(nodes_of_local_size));
  if (!node_from_launcher && id.node_rank >= id.num_nodes) id.node_rank = id.num_nodes - 1;
  if (id.local_rank >= id.local_size)
    throw UsageError(fmt::format("{}: local rank {} is not below the node's task count {}", launcher->source, id.local_rank, id.local_size),
                     "");
  if (node_from_launcher && id.node_rank >= id.num_nodes)  // (one worked out from the rank is a guess: OpenMPI's uneven nodes)
    throw UsageError(fmt::format("{}: node rank {} is not below the node count {}", launcher->source, id.node_rank, id.num_nodes), "");
  return id;
}

}  // namespace ddl::launcher
