// `ddl submit`: flags to a batch job for a site profile; prints the script or the job id.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddl::backends {
struct JobState;
}

namespace ddl::cli {

// The batch options `ddl submit` and `ddl jupyter start` share (-t, -A, -q, -p, -C, ...), each
// stored under its site-profile key; `workers` adds -N and --gpus-per-node.
void add_job_options(CLI::App& app, std::map<std::string, std::string>& options, bool workers);
// One live status line for a followed job (rewritten in place on a terminal).
void print_job_status(const backends::JobState& s);

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
