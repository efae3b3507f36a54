#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.hpp"
#include "launcher/torch_backend.hpp"

namespace fs = std::filesystem;
using ddl::Environment;
using ddl::launcher::with_torch_backend;

namespace {

// A scratch install prefix: PREFIX/bin/ddl and, when `with_hook`, the hook at `hook_folder` under it.
struct ScratchPrefix {
  fs::path root;
  explicit ScratchPrefix(const std::string& hook_folder) {
    char name[] = "/tmp/ddl-torch-backend-XXXXXX";
    root = ::mkdtemp(name);
    fs::create_directories(root / "bin");
    if (!hook_folder.empty()) {
      fs::create_directories(root / hook_folder);
      std::ofstream(root / hook_folder / "sitecustomize.py") << "\n";
    }
  }
  ~ScratchPrefix() { fs::remove_all(root); }
  std::string executable() const { return (root / "bin" / "ddl").string(); }
};

}  // namespace

TEST_CASE("no --torch-backend leaves the workers' environment as it was") {
  const Environment env{{"PYTHONPATH", "/mine"}};
  CHECK(with_torch_backend(env, "", "/nowhere/bin/ddl") == env);
}

TEST_CASE("--torch-backend ddl puts the hook first on PYTHONPATH, before the user's, and names the backend") {
  ScratchPrefix venv("lib/python3.11/site-packages/ddl/_startup");
  const auto hook = (venv.root / "lib/python3.11/site-packages/ddl/_startup").string();
  const auto out = with_torch_backend({{"PYTHONPATH", "/mine"}, {"HOME", "/h"}}, "ddl", venv.executable());
  CHECK(out.at("PYTHONPATH") == hook + ":/mine");
  CHECK(out.at("DDL_TORCH_BACKEND") == "ddl");
  CHECK(out.at("HOME") == "/h");
  CHECK(with_torch_backend({}, "ddl", venv.executable()).at("PYTHONPATH") == hook);
}

TEST_CASE("--torch-backend ddl finds the hook of a cmake --install prefix") {
  ScratchPrefix prefix("lib/python3/dist-packages/ddl/_startup");
  CHECK(with_torch_backend({}, "ddl", prefix.executable()).at("PYTHONPATH") ==
        (prefix.root / "lib/python3/dist-packages/ddl/_startup").string());
}

TEST_CASE("--torch-backend refuses another backend, and a ddl with no Python package beside it, naming the flag") {
  ScratchPrefix bare("");
  CHECK_THROWS_WITH_AS(with_torch_backend({}, "nccl", bare.executable()), doctest::Contains("--torch-backend nccl"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(with_torch_backend({}, "ddl", bare.executable()), doctest::Contains("ddl's Python package is not beside this ddl"),
                       ddl::UsageError);
}
