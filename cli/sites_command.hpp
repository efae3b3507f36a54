// `ddl sites`: the site profiles, and where each value of one came from.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace ddl::cli {

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

}  // namespace ddl::cli
