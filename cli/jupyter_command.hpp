// `ddl jupyter start|tunnel|stop`: Jupyter on a compute node and the ssh line to reach it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace ddl::cli {

struct JupyterFlags;

class JupyterCommand {
 public:
  explicit JupyterCommand(CLI::App& app);
  bool selected() const { return app_->parsed(); }
  int execute() const;

 private:
  int start() const;
  int tunnel() const;
  int stop() const;

  CLI::App* app_;
  CLI::App* start_;
  CLI::App* tunnel_;
  CLI::App* stop_;
  std::shared_ptr<JupyterFlags> flags_;
};

}  // namespace ddl::cli
