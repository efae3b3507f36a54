#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/failure_hints.hpp"

using ddl::launcher::failure_hint;
namespace fs = std::filesystem;

TEST_CASE("a worker whose Python lacks the ddl package gets a hint naming the Python beside ddl") {
  const fs::path venv = fs::temp_directory_path() / "ddl_unit_hint_venv";
  fs::remove_all(venv);
  fs::create_directories(venv / "bin");
  std::ofstream(venv / "bin" / "python3") << "#!/bin/sh\n";
  fs::permissions(venv / "bin" / "python3", fs::perms::owner_all);
  const std::vector<std::string> missing{"Traceback (most recent call last):", "ModuleNotFoundError: No module named 'ddl'"};
  CHECK(failure_hint(missing, (venv / "bin" / "ddl").string()).find((venv / "bin" / "python3").string() + " train.py") !=
        std::string::npos);
  CHECK(failure_hint({"ModuleNotFoundError: No module named 'ddl.torch'"}, "/nowhere/bin/ddl").find("activate its environment") !=
        std::string::npos);
  // Another module, or another error: no hint.
  CHECK(failure_hint({"ModuleNotFoundError: No module named 'ddlx'"}, (venv / "bin" / "ddl").string()).empty());
  CHECK(failure_hint({"RuntimeError: boom"}, (venv / "bin" / "ddl").string()).empty());
  fs::remove_all(venv);
}
