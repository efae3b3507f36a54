// `ddl agent`: what `ddl run -H` starts through the remote shell on every host but the launching
// one. It reads the job (one line of JSON) from stdin, starts this host's workers with the contract
// environment and this host's own GPUs, relays their output as lines labelled with the rank (relayed_output.hpp), and supervises
// them. Its stdin stays the launching host's voice: "signal N" lines reach the workers, and the end
// of stdin (ddl run ended, or the connection dropped) stops them, so no worker outlives the run.
#pragma once

#include <string>

#include "launcher/gpu_inventory.hpp"
#include "launcher/world_plan.hpp"

namespace ddl::launcher {

// The line the agent writes to stderr when a worker fails, for the launching host to read:
// "ddl-agent: failed rank=R code=C signal=S".
inline constexpr const char* kAgentFailurePrefix = "ddl-agent: failed ";

// Runs the job read from `control_fd` and returns the exit code: 0, the first failed worker's
// code, or 128 + the signal that stopped the run. Throws ddl::Error for a job it cannot run.
int run_host_agent(int control_fd);

// Throws UsageError naming `host` when it has fewer `gpus` than the GPU workers of `plan`'s node
// `node_rank` (and they may not share): each host checks its own, the launching host too.
void require_gpus_for_node(const WorldPlan& plan, int node_rank, const GpuInventory& gpus, bool share_gpus, const std::string& host);

}  // namespace ddl::launcher
