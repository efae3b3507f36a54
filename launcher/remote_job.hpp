// What the launching host of `ddl run -H` tells each other host's agent: the plan, the run's
// values, the program and the environment. It travels as one line of JSON on the remote shell's
// stdin (never on a command line, where `ps` on that host would show the store's token).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/environment.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/worker_environment.hpp"
#include "launcher/world_plan.hpp"

namespace ddl::launcher {

struct RemoteJob {
  int node_rank = 0;
  WorldPlan plan;
  GpuOrder gpu_order = GpuOrder::AsListed;
  bool share_gpus = false;
  // No host of the run is the launching host, and neither --cpu nor --gpus-per-node was given: the
  // plan's gpu_workers could not be decided there, and each host pins its own GPUs if it has any.
  bool gpus_if_present = false;
  std::optional<int> cpus_per_task;
  RunContext run;  // cpus_on_node is the agent's to fill in from its own host
  std::vector<std::string> command;
  std::string working_dir;
  Environment env;  // the launching environment, less what belongs to the launching host
  long long grace_period_ms = 10'000;
  long long hang_timeout_ms = 0;  // ddl run's --hang-timeout; 0: none
};

std::string encode_remote_job(const RemoteJob& job);  // one line, no newline
// Throws ddl::Error when `line` is not a job this version of ddl wrote.
RemoteJob decode_remote_job(const std::string& line);

// The environment a remote host's workers start from: `env` without the variables that describe
// the launching host or session (host name, working directory, ssh and X11 session, terminal
// multiplexers, GPU selection, scheduler allocation).
Environment forwarded_environment(const Environment& env);

}  // namespace ddl::launcher
