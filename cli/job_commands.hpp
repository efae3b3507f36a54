// `ddl status` and `ddl cancel`: batch jobs on the scheduler found on PATH.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace ddl::cli {

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
