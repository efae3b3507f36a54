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

}  // namespace

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
