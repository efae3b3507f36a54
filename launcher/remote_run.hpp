// `ddl run -H host:slots,...` / `--hostfile`: workers on several hosts without a scheduler. The
// launching host runs its own workers directly and hosts the store; every other host gets one
// remote shell (ssh) running `ddl agent`, which starts and supervises that host's workers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/host_list.hpp"
#include "launcher/run_job.hpp"

namespace ddl::launcher {

// The default remote shell: ssh that never prompts, gives up on a host it cannot reach within
// 10 s, and notices a connection that died silently within 30 s.
inline constexpr const char* kDefaultRemoteShell =
    "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=10 -o ServerAliveCountMax=3";

struct HostsPlan {
  WorldPlan plan;
  std::vector<HostSlots> hosts;  // the hosts used, node rank order
};

// How many hosts of `hosts` the run uses and how many workers each runs. --nproc-per-node or
// --gpus-per-node: that many on each host. Else -np spreads evenly over the fewest first hosts
// that hold it so (over -N's hosts with -N), or, where no even spread fits, fills the hosts in
// order up to their slots as mpirun and horovodrun do; with no count, every slot of every host
// (of the first -N), so hosts may run different numbers. `gpus_here` are the launching host's.
// Throws UsageError when the slots cannot hold what was asked.
HostsPlan plan_on_hosts(const LaunchRequest& launch, const std::vector<HostSlots>& hosts, int gpus_here);

RunOutcome run_on_hosts(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log);

}  // namespace ddl::launcher
