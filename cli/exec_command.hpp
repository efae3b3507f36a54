// `ddl exec`: the per-task shim (see launcher/exec_task.hpp); flags in, exec out.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddl::cli {

struct ExecFlags;

class ExecCommand {
 public:
  explicit ExecCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  // The program's exit code when --relay keeps ddl exec running; else it never returns.
  int execute(const std::optional<std::vector<std::string>>& program) const;

 private:
  CLI::App* app_;
  std::shared_ptr<ExecFlags> flags_;
};

}  // namespace ddl::cli
