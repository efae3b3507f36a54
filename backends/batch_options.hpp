// The batch options `ddl submit` and `ddl jupyter start` take (-N, -t, -A, -q, ...), one row each:
// the flags and help the CLI shows, the site-profile key the value is kept under, and the
// directive that carries it in a Slurm or PBS script. A new option is one new row.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddl::backends {

// Where a script has room for an option without the site's profile naming it ({{key}}).
enum class ScriptPlace {
  Always,       // both schedulers' scripts
  SlurmOnly,    // sbatch has a directive for it, qsub has none
  ProfileOnly,  // only where the profile's directives, GPU request or container name it
};

struct BatchOption {
  std::string_view key;    // the site-profile key ("account"), also the key of JobRequest::options
  std::string_view flags;  // the CLI's names, CLI11 style ("-A,--account")
  std::string_view help;
  bool workers_only;  // a flag of jobs that run workers (`ddl submit`), not of `ddl jupyter start`
  ScriptPlace place;
  std::string_view slurm;  // "#SBATCH --<slurm>=<value>"; empty when rendered another way (or not at all)
  std::string_view pbs;    // "#PBS <pbs><value>"; empty when rendered another way (or not at all)
};

// Every option, in the order the CLI lists them and the scripts write them.
const std::vector<BatchOption>& batch_options();

// The flag a user types for an option key, for messages: "account" -> "-A/--account". Values
// derived from an option name that option's flag ("tasks_per_node" -> "--gpus-per-node").
std::string flag_for(std::string_view key);

}  // namespace ddl::backends
