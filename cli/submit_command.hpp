// `ddl submit`: flags to a batch job for a site profile; prints the script or the job id.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddl::cli {

struct SubmitFlags;

class SubmitCommand {
 public:
  explicit SubmitCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute(const std::optional<std::vector<std::string>>& program) const;

 private:
  CLI::App* app_;
  std::shared_ptr<SubmitFlags> flags_;
};

}  // namespace ddl::cli
