// Fuzz target `slurm_tasks`: what `ddl run` reads from a Slurm allocation's variables
// (backends/slurm/slurm_launch): tasks_per_node from SLURM_TASKS_PER_NODE ("2(x3),1") and from
// SLURM_NTASKS_PER_NODE, and, from the same bytes, gpus_per_node (SLURM_GPUS_ON_NODE,
// SLURM_GPUS_PER_NODE "a100:2,v100:1", SLURM_JOB_GPUS) and cpus_per_node (SLURM_CPUS_ON_NODE,
// SLURM_JOB_CPUS_PER_NODE).
//
//   byte 0   the node count tasks_per_node is given (0-255)
//   rest     the variable's value
//
// A count Slurm would not write ("abc", 99999999999) is a ddl::Error naming the variable; any other
// exception, a crash or a sanitizer report is a finding. Oracle:
// tasks_per_node gives counts of at least 1, at most a million entries (and one per node from
// SLURM_NTASKS_PER_NODE); cpus_per_node is at least 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/slurm/slurm_launch.hpp"
#include "common/error.hpp"

using namespace ddl::backends::slurm;

namespace {

[[noreturn]] void finding(const char* what, const std::string& value, long got) {
  std::fprintf(stderr, "fuzz_slurm_tasks: %s for '%s' (got %ld)\n", what, value.c_str(), got);
  std::abort();
}

void check_tasks(const std::vector<int>& counts, const std::string& value, size_t most) {
  if (counts.size() > most) finding("more task counts than allowed", value, static_cast<long>(counts.size()));
  for (int c : counts)
    if (c < 1) finding("a task count below 1", value, c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int nodes = data[0];
  const std::string value(reinterpret_cast<const char*>(data) + 1, size - 1);

  check_tasks(tasks_per_node({{"SLURM_TASKS_PER_NODE", value}}, nodes), value, 1'000'000);
  try {
    const auto per_node = tasks_per_node({{"SLURM_NTASKS_PER_NODE", value}}, nodes);
    check_tasks(per_node, value, static_cast<size_t>(std::max(nodes, 1)));
  } catch (const ddl::Error&) {}
  for (const char* var : {"SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS"}) {
    try {
      if (int gpus = gpus_per_node({{var, value}}); gpus < 0) finding("gpus_per_node below 0", value, gpus);
    } catch (const ddl::Error&) {}
  }
  for (const char* var : {"SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE"}) {
    try {
      if (int cpus = cpus_per_node({{var, value}}); cpus < 1) finding("cpus_per_node below 1", value, cpus);
    } catch (const ddl::Error&) {}
  }
  return 0;
}
