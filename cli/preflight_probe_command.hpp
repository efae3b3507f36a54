// `ddl preflight-probe`: what `ddl run --preflight` runs in each worker's place before the program
// (launcher/preflight.hpp). Hidden from --help: people do not run it by hand.
#pragma once

#include <CLI/CLI.hpp>

namespace ddl::cli {

class PreflightProbeCommand {
 public:
  explicit PreflightProbeCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute() const;

 private:
  CLI::App* app_;
  bool among_all_ = false;
  bool cpu_ = false;
};

}  // namespace ddl::cli
