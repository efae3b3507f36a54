#include <doctest/doctest.h>

#include "backends/jobs.hpp"

using ddl::backends::scheduler_unreachable;

TEST_CASE("sbatch and qsub saying they reached no scheduler is told apart from a refusal") {
  CHECK(scheduler_unreachable("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n"));
  CHECK(scheduler_unreachable("qsub: cannot connect to server pbs01 (errno=111) Connection refused\n"));
  CHECK_FALSE(
      scheduler_unreachable("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"));
  CHECK_FALSE(scheduler_unreachable("qsub: Unknown queue"));
  CHECK_FALSE(scheduler_unreachable(""));
}
