// The usage line of commands that run a program (run, exec, submit): CLI11 lists only the
// options, so "Usage: ddl run [OPTIONS]" would hide where the program goes.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace ddl::cli {

class ProgramUsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, std::move(name));
    const auto end = usage.find_last_not_of('\n');
    return usage.substr(0, end + 1) + " [--] PROGRAM [ARGS...]" + usage.substr(end + 1);
  }
};

// Gives `app` (a command that takes a program after its options) the usage line that says so.
inline void show_program_in_usage(CLI::App& app) { app.formatter(std::make_shared<ProgramUsageFormatter>()); }

}  // namespace ddl::cli
