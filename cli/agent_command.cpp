#include "cli/agent_command.hpp"

#include <unistd.h>

#include "launcher/host_agent.hpp"

namespace ddl::cli {

AgentCommand::AgentCommand(CLI::App& app) {
  app_ = app.add_subcommand("agent", "Run this host's workers of a `ddl run -H` job read from stdin (started by ddl run)");
  app_->group("");  // hidden
}

int AgentCommand::execute() const { return launcher::run_host_agent(STDIN_FILENO); }

}  // namespace ddl::cli
