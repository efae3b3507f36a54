// `ddl check-build`: prints launcher::capability_report as checked lines or as JSON.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

namespace ddl::cli {

struct CheckBuildFlags;

class CheckBuildCommand {
 public:
  explicit CheckBuildCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute() const;

 private:
  CLI::App* app_;
  std::shared_ptr<CheckBuildFlags> flags_;
};

}  // namespace ddl::cli
