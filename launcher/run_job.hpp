// `ddl run` on this node: plan the world, host the rendezvous store, reserve MASTER_PORT, start one
// worker per slot with the contract environment, and supervise them to the end.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/supervisor.hpp"
#include "launcher/world_plan.hpp"
#include "runtime/src/common/environment.hpp"

namespace ddl::launcher {

struct RunRequest {
  LaunchRequest launch;
  std::vector<std::string> command;  // program and its arguments
  SupervisorOptions supervision;
};

// Runs the job and returns how it ended. Bad requests throw ddl::UsageError (exit 2); a program
// that cannot be run throws ddl::Error with exit status 127, before any worker starts.
// `log` receives the launcher's own messages (the store's warnings).
RunOutcome run_job(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log);

}  // namespace ddl::launcher
