#include "launcher/torch_backend.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "launcher/install_layout.hpp"

namespace ddl::launcher {

namespace fs = std::filesystem;

namespace {

// The first candidate folder that holds the hook; "" if none does.
std::string installed_hook(const std::string& executable) {
  const auto candidates = startup_hook_folders(executable);
  auto hook = std::find_if(candidates.begin(), candidates.end(), [](const std::string& dir) {
    std::error_code ec;
    return fs::is_regular_file(fs::path(dir) / "sitecustomize.py", ec);
  });
  return hook == candidates.end() ? std::string() : *hook;
}

// The first of Python's flags -I, -E and -S among `command`'s options (before the script, -c or
// -m), as written ("-I", "-uE"); "" for none, or for a program that is not Python.
std::string python_flag_that_skips_site(const std::vector<std::string>& command) {
  if (command.empty() || !fs::path(command.front()).filename().string().starts_with("python")) return {};
  for (size_t i = 1; i < command.size(); ++i) {
    const std::string& arg = command[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--" || arg.starts_with("--")) return {};  // the script, or a long option's end
    for (size_t k = 1; k < arg.size(); ++k) {
      const char flag = arg[k];
      if (flag == 'I' || flag == 'E' || flag == 'S') return arg;
      if (flag == 'c' || flag == 'm') return {};  // the program follows
      if (flag == 'W' || flag == 'X') {           // takes the rest, or the next argument
        if (k + 1 == arg.size()) ++i;
        break;
      }
    }
  }
  return {};
}

}  // namespace

void check_python_runs_the_hook(const std::vector<std::string>& command, const std::string& backend) {
  if (backend.empty()) return;
  const std::string flag = python_flag_that_skips_site(command);
  if (flag.empty()) return;
  throw UsageError(fmt::format("--torch-backend {}: '{} {}' keeps ddl's start-up hook from running ({}), so the script's own "
                               "backend would run",
                               backend, command.front(), flag,
                               flag.find('S') != std::string::npos ? "-S: no sitecustomize" : "-I/-E: PYTHONPATH ignored"),
                   "leave out -I, -E and -S, or call init_process_group(\"ddl\") in the script (with import ddl.distributed)");
}

Environment with_python_startup_hook(const Environment& env, const std::string& backend, const std::string& executable) {
  if (!backend.empty() && backend != "ddl")
    throw UsageError(fmt::format("--torch-backend {}: the only backend ddl can put under a script is ddl", backend),
                     "use --torch-backend ddl, or leave the flag out to run the backend the script names");
  const std::string hook = installed_hook(executable);
  if (hook.empty() && !backend.empty())
    throw UsageError(fmt::format("--torch-backend ddl: ddl's Python package is not beside this ddl (looked in {})",
                                 fmt::join(startup_hook_folders(executable), ", ")),
                     "install ddl with pip or cmake --install (which install the package beside the command)");
  Environment out = env;
  if (!backend.empty()) out["DDL_TORCH_BACKEND"] = backend;
  if (hook.empty()) return out;
  auto old = env.find("PYTHONPATH");
  const std::string before = old == env.end() ? std::string() : old->second;
  // A ddl run inside a worker of another finds the hook there already.
  if (before == hook || before.starts_with(hook + ":")) return out;
  out["PYTHONPATH"] = before.empty() ? hook : hook + ":" + before;
  return out;
}

}  // namespace ddl::launcher
