#include "launcher/failure_hints.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

namespace ddl::launcher {

namespace {

// Python's "No module named 'ddl'" (or 'ddl.torch'...): the workers' Python is not the one ddl's
// package was installed for. Typical of a venv's ddl called by its path without activating the
// venv (a batch script): `python3` is then the system's.
bool misses_the_ddl_package(const std::string& line) {
  return line.find("No module named 'ddl'") != std::string::npos || line.find("No module named 'ddl.") != std::string::npos;
}

}  // namespace

std::string failure_hint(const std::vector<std::string>& stderr_tail, const std::string& ddl_program) {
  if (std::none_of(stderr_tail.begin(), stderr_tail.end(), misses_the_ddl_package)) return "";
  const std::filesystem::path python = std::filesystem::path(ddl_program).parent_path() / "python3";
  if (!ddl_program.empty() && ::access(python.c_str(), X_OK) == 0)
    return fmt::format(
        "the workers' Python has no ddl package: activate the environment ddl is installed in, or run its "
        "Python: ddl run ... -- {} train.py",
        python.string());
  return "the workers' Python has no ddl package: run them with the Python ddl is installed for (activate its environment, "
         "or `module load` it)";
}

}  // namespace ddl::launcher
