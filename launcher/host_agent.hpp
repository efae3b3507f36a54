// `ddl agent`: what `ddl run -H` starts through the remote shell on every host but the launching
// one. It reads the job (one line of JSON) from stdin, starts this host's workers with the contract
// environment and this host's own GPUs, relays their output as lines labelled with the rank (relayed_output.hpp), and supervises
// them. Its stdin stays the launching host's voice: "signal N" lines reach the workers, and the end
// of stdin (ddl run ended, or the connection dropped) stops them, so no worker outlives the run.
#pragma once

namespace ddl::launcher {

// The line the agent writes to stderr when a worker fails, for the launching host to read:
// "ddl-agent: failed rank=R code=C signal=S".
inline constexpr const char* kAgentFailurePrefix = "ddl-agent: failed ";

// Runs the job read from `control_fd` and returns the exit code: 0, the first failed worker's
// code, or 128 + the signal that stopped the run. Throws ddl::Error for a job it cannot run.
int run_host_agent(int control_fd);

}  // namespace ddl::launcher
