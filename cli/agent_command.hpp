// `ddl agent`: the per-host side of `ddl run -H`, started through the remote shell (see
// launcher/host_agent.hpp). Hidden from --help: people do not run it by hand.
#pragma once

#include <CLI/CLI.hpp>

namespace ddl::cli {

class AgentCommand {
 public:
  explicit AgentCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute() const;

 private:
  CLI::App* app_;
};

}  // namespace ddl::cli
