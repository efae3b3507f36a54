// Which batch scheduler allocation, if any, this process runs inside. Later: one folder per
// scheduler (local/, slurm/, pbs/) with launch commands and batch scripts; backends never print.
#pragma once

#include <string>

#include "backends/scheduler.hpp"
#include "common/environment.hpp"

namespace ddl::backends {

struct Allocation {
  Scheduler scheduler = Scheduler::None;
  std::string job_id;  // empty outside an allocation
  int num_nodes = 1;   // nodes the allocation holds (1 outside one)
};

// Reads SLURM_JOB_ID / SLURM_JOB_NUM_NODES, or PBS_JOBID / PBS_NODEFILE (distinct host lines).
Allocation detect_allocation(const Environment& env);

}  // namespace ddl::backends
