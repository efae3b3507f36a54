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

// `ddl sites`, `ddl sites show NAME`.
class SitesCommand {
 public:
  explicit SitesCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute() const;

 private:
  CLI::App* app_;
  CLI::App* show_;
  std::shared_ptr<std::string> name_;
};

// `ddl status [JOB]`, `ddl cancel JOB`.
class JobCommands {
 public:
  explicit JobCommands(CLI::App& app);
  bool selected() const { return status_->parsed() || cancel_->parsed(); }
  int execute() const;

 private:
  CLI::App* status_;
  CLI::App* cancel_;
  std::shared_ptr<std::string> job_;
};

}  // namespace ddl::cli
