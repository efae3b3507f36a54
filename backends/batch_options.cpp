#include "backends/batch_options.hpp"

#include <algorithm>
#include <sstream>

namespace ddl::backends {

const std::vector<BatchOption>& batch_options() {
  using enum ScriptPlace;
  static const std::vector<BatchOption> options = {
      // key             flags                    help                                                       workers  place        slurm pbs
      {"nodes", "-N,--nodes", "Nodes", true, Always, "nodes", ""},
      {"gpus_per_node", "--gpus-per-node", "GPUs (and workers) per node; default: all the site's", true, Always, "", ""},
      {"cpus_per_task", "-c,--cpus-per-task", "Cores per worker", false, Always, "cpus-per-task", ""},
      {"time", "-t,--time", "Time limit, HH:MM:SS", false, Always, "time", ""},
      {"account", "-A,--account", "Account/project to charge", false, Always, "account", "-A "},
      {"queue", "-q,--queue,--qos", "Slurm QOS / PBS queue", false, Always, "qos", "-q "},
      {"partition", "-p,--partition", "Slurm partition", false, SlurmOnly, "partition", ""},
      {"constraint", "-C,--constraint", "Slurm node features (Perlmutter: gpu)", false, SlurmOnly, "constraint", ""},
      {"job_name", "-J,--job-name", "Job name", false, Always, "job-name", "-N "},
      {"output", "-o,--output", "Output file (Slurm: %j is the job id)", false, Always, "output", "-o "},
      {"dependency", "-d,--dependency", "Start after another job: afterok:ID", false, Always, "dependency", "-W depend="},
      {"comment", "--comment", "Slurm --comment (Neuron: the application, e.g. pytorch)", false, SlurmOnly, "comment", ""},
      {"mem", "--mem", "Memory per node", false, SlurmOnly, "mem", ""},
      // Workers' only: `ddl jupyter start` runs Jupyter from the site's modules or --env, not in a container.
      {"image", "--image", "Container image (Shifter/Apptainer/Singularity, as the site has)", true, ProfileOnly, "", ""},
      {"filesystems", "--filesystems", "PBS -l filesystems= (Polaris: home:eagle)", false, ProfileOnly, "", ""},
      {"gpu_type", "--gpu-type", "GPU model where the site asks for one (Alliance: a100, h100)", false, ProfileOnly, "", ""},
  };
  return options;
}

namespace {

// "-q,--queue,--qos" -> "-q/--queue": the short name and the first long one.
std::string shown_flags(std::string_view flags) {
  std::string short_name, long_name;
  std::istringstream names{std::string(flags)};
  for (std::string name; std::getline(names, name, ',');) {
    if (name.starts_with("--")) {
      if (long_name.empty()) long_name = name;
    } else if (short_name.empty()) {
      short_name = name;
    }
  }
  return short_name.empty() ? long_name : short_name + "/" + long_name;
}

// Values a script derives from an option: a message about one names the option the user gives.
std::string_view option_behind(std::string_view key) {
  if (key == "tasks_per_node") return "gpus_per_node";
  if (key == "cpus_per_node") return "cpus_per_task";
  return key;
}

}  // namespace

std::string flag_for(std::string_view key) {
  const std::string_view option = option_behind(key);
  const auto& options = batch_options();
  auto it = std::find_if(options.begin(), options.end(), [&](const BatchOption& o) { return o.key == option; });
  return it == options.end() ? std::string(key) : shown_flags(it->flags);
}

}  // namespace ddl::backends
