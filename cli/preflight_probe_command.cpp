#include "cli/preflight_probe_command.hpp"

#include "common/environment.hpp"
#include "launcher/preflight.hpp"

namespace ddl::cli {

PreflightProbeCommand::PreflightProbeCommand(CLI::App& app) {
  app_ = app.add_subcommand("preflight-probe", "Check this worker's GPU and libddl's allreduce (started by ddl run --preflight)");
  app_->group("");  // hidden
  app_->add_flag("--cpu", cpu_, "A CPU worker: no GPU to check");
  app_->add_flag("--among-all", among_all_, "libddl's start-up and an allreduce among all ranks (else: this worker's GPU and libddl)");
}

int PreflightProbeCommand::execute() const {
  return launcher::run_preflight_probe(among_all_ ? launcher::ProbeStage::AmongAll : launcher::ProbeStage::OnEachHost, cpu_,
                                       current_environment());
}

}  // namespace ddl::cli
