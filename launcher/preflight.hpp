// `ddl run --preflight`: before the program, every worker's place runs a short probe (`ddl
// preflight-probe`): a CUDA context and a little device memory on its GPU, where it has one, and
// libddl's loading; then libddl's start-up and an allreduce among all the run's ranks (shared
// memory within a node, Gloo across). The run goes on only when every probe passed; with
// --preflight exclude, the hosts whose own probes failed are left out instead (as --exclude leaves
// them out), where other hosts passed.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

enum class PreflightMode {
  Off,
  Check,    // --preflight: any failed probe stops the run before the program starts
  Exclude,  // --preflight exclude: the failed probes' hosts are left out, and the run goes on on the others
};

// The probes run twice: first each on its own (its GPU; that libddl loads), so that a host's
// failure is its own; then, where all passed, libddl's start-up and an allreduce among all ranks,
// whose failure (a network between the hosts) belongs to no one host.
enum class ProbeStage { OnEachHost, AmongAll };

// The probe, in a worker's place: prints one line, "ddl-preflight: ok on HOST [node N]: WHAT" or
// "ddl-preflight: failed on HOST [node N]: WHY" (N: its GROUP_RANK), and exits 0 either way (a
// failure must not stop the other probes before they said theirs). A step that takes longer than
// kProbeStepSeconds (a wedged GPU) is a failure too ("timed out in cuInit"). `cpu`: the worker has no GPU to check.
inline constexpr unsigned kProbeStepSeconds = 120;
int run_preflight_probe(ProbeStage stage, bool cpu, const Environment& env);

// One probe's word, from the output it printed; nullopt when it printed none.
struct ProbeVerdict {
  std::string host;  // as the probe's host calls itself
  int node = -1;     // its node's place in the run
  bool ok = false;
  std::string detail;  // what passed, or why it failed
};
std::optional<ProbeVerdict> probe_verdict(const std::string& output);

// What the probes of a run found, host by host.
struct PreflightFindings {
  int ranks_passed = 0;
  std::vector<std::string> hosts_passed;
  std::map<std::string, std::string> failed_hosts;  // host -> the first reason one of its probes gave
  std::vector<int> ranks_unheard;                   // ranks whose probe printed no verdict
};

// Reads every DIR/rank.N.out (ddl run --output-dir's files; a rank that wrote nothing may have
// none); `host_of` names a verdict's host (the name the run knows it by), its own name if empty.
PreflightFindings read_probe_outputs(const std::string& dir, const std::function<std::string(const ProbeVerdict&)>& host_of);

}  // namespace ddl::launcher
