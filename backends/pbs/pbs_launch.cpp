#include "backends/pbs/pbs_launch.hpp"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "backends/command.hpp"
#include "runtime/src/common/error.hpp"

namespace ddl::backends::pbs {

std::vector<std::string> nodefile_hosts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("cannot read PBS_NODEFILE {}", path), "run ddl inside the PBS job that wrote it");
  std::vector<std::string> hosts;
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (!line.empty() && std::find(hosts.begin(), hosts.end(), line) == hosts.end()) hosts.push_back(line);
  }
  if (hosts.empty()) throw Error(fmt::format("PBS_NODEFILE {} names no host", path), "run ddl inside the PBS job that wrote it");
  return hosts;
}

MpiLauncher detect_mpi_launcher() {
  CommandResult r = run_command({"mpiexec", "--version"}, std::chrono::seconds(10));
  const std::string said = r.out + r.err;
  return said.find("PALS") != std::string::npos || said.find("pals") != std::string::npos ? MpiLauncher::Pals : MpiLauncher::OpenMpi;
}

std::vector<std::string> pals_command(const TaskLayout& layout) {
  std::string names;
  for (const auto& name : layout.exported_names) names += (names.empty() ? "" : ",") + name;
  std::vector<std::string> argv = {"mpiexec",
                                   "-n", std::to_string(layout.num_nodes * layout.tasks_per_node),
                                   "--ppn", std::to_string(layout.tasks_per_node),
                                   "--depth", std::to_string(layout.cpus_per_task),
                                   "--cpu-bind", "depth",
                                   "--label"};
  // PALS passes the whole environment by default; --envlist is not used so PATH etc. still go.
  argv.insert(argv.end(), layout.task_command.begin(), layout.task_command.end());
  return argv;
}

std::vector<std::string> openmpi_command(const TaskLayout& layout, const std::string& nodefile, bool as_root) {
  std::vector<std::string> argv = {"mpirun"};
  if (as_root) argv.push_back("--allow-run-as-root");
  const std::vector<std::string> placement = {"-np", std::to_string(layout.num_nodes * layout.tasks_per_node),
                                               "--hostfile", nodefile,
                                               "--map-by", fmt::format("ppr:{}:node", layout.tasks_per_node),
                                               "--bind-to", "none",
                                               "--oversubscribe",  // PBS may list a node fewer times than it runs tasks
                                               "--tag-output"};
  argv.insert(argv.end(), placement.begin(), placement.end());
  for (const auto& name : layout.exported_names) {
    argv.push_back("-x");
    argv.push_back(name);  // the name alone: the value (the store token too) stays off the command line
  }
  argv.insert(argv.end(), layout.task_command.begin(), layout.task_command.end());
  return argv;
}

std::optional<TaskLine> openmpi_label(std::string_view line) {
  // [jobid,rank]<stdout>: or <stderr>:
  if (line.empty() || line[0] != '[') return std::nullopt;
  auto comma = line.find(',');
  auto close = line.find("]<");
  if (comma == std::string_view::npos || close == std::string_view::npos || comma > close) return std::nullopt;
  auto colon = line.find(">:", close);
  if (colon == std::string_view::npos) return std::nullopt;
  int rank = 0;
  for (size_t i = comma + 1; i < close; ++i) {
    if (line[i] < '0' || line[i] > '9') return std::nullopt;
    rank = rank * 10 + (line[i] - '0');
  }
  std::string_view text = line.substr(colon + 2);
  return TaskLine{rank, text};
}

}  // namespace ddl::backends::pbs
