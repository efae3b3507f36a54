#include "backends/allocation.hpp"

#include "common/text_file.hpp"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace ddl::backends {

namespace {
int positive_int_or(const std::optional<std::string>& value, int fallback) {
  if (!value) return fallback;
  char* end = nullptr;
  long n = std::strtol(value->c_str(), &end, 10);
  // Past int's range is no count a scheduler gives: the fallback, not a wrapped-around number.
  return (value->empty() || *end != '\0' || n < 1 || n > std::numeric_limits<int>::max()) ? fallback : static_cast<int>(n);
}

int distinct_hosts_in(const std::string& nodefile) {
  std::stringstream in(read_text_file(nodefile, "PBS_NODEFILE"));
  std::set<std::string> hosts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) hosts.insert(line);
  return hosts.empty() ? 1 : static_cast<int>(hosts.size());
}
}  // namespace

Allocation detect_allocation(const Environment& env) {
  if (auto job = lookup(env, "SLURM_JOB_ID"); job && !job->empty()) {
    auto nodes = lookup(env, "SLURM_JOB_NUM_NODES");
    if (!nodes) nodes = lookup(env, "SLURM_NNODES");
    return {Scheduler::Slurm, *job, positive_int_or(nodes, 1)};
  }
  if (auto job = lookup(env, "PBS_JOBID"); job && !job->empty()) {
    auto nodefile = lookup(env, "PBS_NODEFILE");
    return {Scheduler::Pbs, *job, nodefile ? distinct_hosts_in(*nodefile) : 1};
  }
  return {};
}

}  // namespace ddl::backends
