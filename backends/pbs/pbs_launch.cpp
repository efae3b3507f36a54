#include "backends/pbs/pbs_launch.hpp"

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/command.hpp"
#include "common/error.hpp"
#include "common/text_file.hpp"

namespace ddl::backends::pbs {

std::vector<std::string> nodefile_hosts(const std::string& path) {
  std::stringstream in(read_text_file(path, "PBS_NODEFILE"));
  std::vector<std::string> hosts;
  std::unordered_set<std::string> seen;  // a search of `hosts` per line would be quadratic: minutes for 300,000 lines
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (!line.empty() && seen.insert(line).second) hosts.push_back(line);
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
                                   "-n",
                                   std::to_string(layout.num_nodes * layout.tasks_per_node),
                                   "--ppn",
                                   std::to_string(layout.tasks_per_node),
                                   "--depth",
                                   std::to_string(layout.cpus_per_task),
                                   "--cpu-bind",
                                   "depth",
                                   "--label"};
  if (!layout.hosts.empty()) argv.insert(argv.end(), {"--hosts", fmt::format("{}", fmt::join(layout.hosts, ","))});
  // PALS passes the whole environment by default; --envlist is not used so PATH etc. still go.
  argv.insert(argv.end(), layout.task_command.begin(), layout.task_command.end());
  return argv;
}

std::vector<std::string> openmpi_command(const TaskLayout& layout, const std::string& nodefile, bool as_root) {
  std::vector<std::string> argv = {"mpirun"};
  if (as_root) argv.emplace_back("--allow-run-as-root");
  std::vector<std::string> hosts = {"--hostfile", nodefile};
  if (!layout.hosts.empty()) {
    std::vector<std::string> with_slots;
    for (const auto& host : layout.hosts) with_slots.push_back(fmt::format("{}:{}", host, layout.tasks_per_node));
    hosts = {"--host", fmt::format("{}", fmt::join(with_slots, ","))};
  }
  argv.insert(argv.end(), {"-np", std::to_string(layout.num_nodes * layout.tasks_per_node)});
  argv.insert(argv.end(), hosts.begin(), hosts.end());
  const std::vector<std::string> placement = {"--map-by",        fmt::format("ppr:{}:node", layout.tasks_per_node), "--bind-to", "none",
                                              "--oversubscribe",  // PBS may list a node fewer times than it runs tasks
                                              "--tag-output"};
  argv.insert(argv.end(), placement.begin(), placement.end());
  for (const auto& name : layout.exported_names) {
    argv.emplace_back("-x");
    argv.push_back(name);  // the name alone: the value (the store token too) stays off the command line
  }
  argv.insert(argv.end(), layout.task_command.begin(), layout.task_command.end());
  return argv;
}

std::optional<std::vector<TaskLine>> OpenMpiOutput::feed(std::string_view line) {
  // Bounded counts: std::regex recurses once per character it matches, and a task's own text
  // ("[" and 100,000 digits) is searched too.
  static const std::regex tag(R"(\[\d{1,9},(\d{1,9})\]<std(out|err)>:)");
  using Iterator = std::regex_iterator<std::string_view::const_iterator>;
  std::vector<std::match_results<std::string_view::const_iterator>> tags;
  for (Iterator it(line.begin(), line.end(), tag), end; it != end; ++it) tags.push_back(*it);
  if (tags.empty() || tags.front().position() != 0) return std::nullopt;

  auto key_of = [&](size_t i) { return std::make_pair(std::stoi(tags[i][1].str()), tags[i][2].str() == "err"); };
  auto end_of = [&](size_t i) { return static_cast<size_t>(tags[i].position() + tags[i].length()); };
  size_t open = 0;  // the tag of the piece being read
  for (size_t i = 1; i < tags.size(); ++i) {
    const auto key = key_of(i);
    const bool continues = key == key_of(open) || unfinished_.count(key) != 0;
    if (starts_task_text_ && !continues && !starts_task_text_(key.first, line.substr(end_of(i)))) continue;  // the task's text
    const size_t from = end_of(open);
    unfinished_[key_of(open)].append(line.substr(from, static_cast<size_t>(tags[i].position()) - from));
    open = i;
  }
  // The piece the line's newline ends completes its task's line.
  const auto key = key_of(open);
  std::string text = std::move(unfinished_[key]);
  unfinished_.erase(key);
  text.append(line.substr(end_of(open)));
  return std::vector<TaskLine>{{key.first, std::move(text)}};
}

}  // namespace ddl::backends::pbs
