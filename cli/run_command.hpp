// `ddl run`: flags to a launcher::RunRequest, and the run's outcome to words.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddl::cli {

struct RunFlags;

class RunCommand {
 public:
  explicit RunCommand(CLI::App& app);  // adds the `run` subcommand and its flags to `app`
  bool selected() const { return app_->parsed(); }
  // Runs the job; returns ddl's exit code. `program` is what followed "--", when it was given;
  // otherwise the program is the first argument `run` did not recognise, and what follows it.
  int execute(const std::optional<std::vector<std::string>>& program) const;

 private:
  CLI::App* app_;
  std::shared_ptr<RunFlags> flags_;
};

}  // namespace ddl::cli
