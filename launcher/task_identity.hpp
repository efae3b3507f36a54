// Which worker a task is, read from the variables of whichever launcher started it: Slurm's srun,
// OpenMPI's mpirun, Cray PALS / MPICH mpiexec, or any PMIx launcher. `ddl exec` maps it onto the
// worker environment contract (DESIGN.md section 4).
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

struct TaskIdentity {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string source;  // the launcher the ranks came from, for messages: "Slurm (SLURM_PROCID)"
};

// The task's identity. Ranks come from the launcher's variables (OMPI_COMM_WORLD_*, PALS_*,
// PMI_*, SLURM_*, PMIX_RANK, in that order); sizes the launcher does not export come from the
// shape `ddl run` exported (DDL_SIZE, DDL_LOCAL_SIZE, DDL_NUM_NODES), with ranks laid out node by
// node. Throws UsageError naming the variable when none is set, one is not a number, or the
// launcher's and ddl run's world sizes disagree.
TaskIdentity task_identity(const Environment& env);

// The number of tasks on node `node` from Slurm's compressed form: "4(x2),3" -> 4, 4, 3.
int tasks_on_node(const std::string& tasks_per_node, int node);

// The task counts of nodes 0 .. nodes-1 from that form, read once; UsageError as tasks_on_node.
std::vector<int> tasks_on_nodes(const std::string& tasks_per_node, int nodes);

}  // namespace ddl::launcher
