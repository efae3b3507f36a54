// `ddl run` inside a Slurm or PBS allocation: plan the world over its nodes, host the store for
// all of them, and start one task per worker through the allocation's launcher (srun, Cray PALS
// mpiexec, OpenMPI mpirun), each task passing through `ddl exec`. The launcher is supervised like
// a worker: its lines are relabelled by rank, and a failed task ends the run with its code.
#pragma once

#include <functional>
#include <string>

#include "backends/allocation.hpp"
#include "launcher/run_job.hpp"

namespace ddl::launcher {

RunOutcome run_in_allocation(const RunRequest& request, const backends::Allocation& allocation, const Environment& env,
                             const std::function<void(const std::string&)>& log);

}  // namespace ddl::launcher
