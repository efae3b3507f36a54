#include "cli/check_build_command.hpp"

#include <signal.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/validators.hpp"
#include "launcher/capability_report.hpp"

namespace ddl::cli {

struct CheckBuildFlags {
  std::string python = launcher::default_python();
  int probe_timeout = 60;
  bool json = false;
};

CheckBuildCommand::CheckBuildCommand(CLI::App& app) : flags_(std::make_shared<CheckBuildFlags>()) {
  CheckBuildFlags& f = *flags_;
  app_ = app.add_subcommand("check-build", "What this build and this machine can do: will my job work here?");
  app_->add_option("--python", f.python,
                   "The Python whose frameworks to probe (default: the python3 beside ddl in a venv or conda env, else PATH's)")
      ->capture_default_str()
      ->transform(home_expanded_path());
  app_->add_option("--probe-timeout", f.probe_timeout, "Seconds each framework import may take")
      ->capture_default_str()
      ->transform(whole_number_between(1, 3600));
  app_->add_flag("--json", f.json, "Print the same as JSON");
}

int CheckBuildCommand::execute() const {
  // A probe that exits before reading what ddl writes to it made that write kill ddl (SIGPIPE, a
  // rare flake of test_nccl_loading); ignored, the write fails and the probe's own result counts.
  ::signal(SIGPIPE, SIG_IGN);
  launcher::CapabilityOptions options;
  options.python = flags_->python;
  options.probe_timeout = std::chrono::seconds(flags_->probe_timeout);
  const auto report = launcher::capability_report(current_environment(), options);
  if (flags_->json) {
    std::printf("%s\n", launcher::capability_json(report).dump(2).c_str());
    return 0;
  }
  std::printf("ddl check-build\n");
  for (const auto& section : report) {
    std::printf("\n%s\n", section.title.c_str());
    for (const auto& i : section.items) {
      std::string name = i.version.empty() ? i.name : i.name + " " + i.version;
      std::printf("  [%s] %s%s\n", i.ok ? "X" : " ", name.c_str(), i.detail.empty() ? "" : fmt::format(" ({})", i.detail).c_str());
    }
  }
  return 0;
}

}  // namespace ddl::cli
