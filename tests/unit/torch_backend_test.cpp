#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.hpp"
#include "launcher/torch_backend.hpp"

namespace fs = std::filesystem;
using ddl::Environment;
using ddl::launcher::check_python_runs_the_hook;
using ddl::launcher::with_python_startup_hook;

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

TEST_CASE("without ddl's Python package beside it, and no --torch-backend, the workers' environment is as it was") {
  const Environment env{{"PYTHONPATH", "/mine"}};
  CHECK(with_python_startup_hook(env, "", "/nowhere/bin/ddl") == env);
}

TEST_CASE("without --torch-backend the hook goes first on PYTHONPATH, once, and no backend is named") {
  ScratchPrefix venv("lib/python3.11/site-packages/ddl/_startup");
  const auto hook = (venv.root / "lib/python3.11/site-packages/ddl/_startup").string();
  const auto out = with_python_startup_hook({{"PYTHONPATH", "/mine"}}, "", venv.executable());
  CHECK(out.at("PYTHONPATH") == hook + ":/mine");
  CHECK(out.count("DDL_TORCH_BACKEND") == 0);
  CHECK(with_python_startup_hook(out, "", venv.executable()) == out);
  CHECK(with_python_startup_hook({}, "", venv.executable()).at("PYTHONPATH") == hook);
}

TEST_CASE("--torch-backend ddl puts the hook first on PYTHONPATH, before the user's, and names the backend") {
  ScratchPrefix venv("lib/python3.11/site-packages/ddl/_startup");
  const auto hook = (venv.root / "lib/python3.11/site-packages/ddl/_startup").string();
  const auto out = with_python_startup_hook({{"PYTHONPATH", "/mine"}, {"HOME", "/h"}}, "ddl", venv.executable());
  CHECK(out.at("PYTHONPATH") == hook + ":/mine");
  CHECK(out.at("DDL_TORCH_BACKEND") == "ddl");
  CHECK(out.at("HOME") == "/h");
  CHECK(with_python_startup_hook({}, "ddl", venv.executable()).at("PYTHONPATH") == hook);
}

TEST_CASE("--torch-backend ddl finds the hook of a cmake --install prefix") {
  ScratchPrefix prefix("lib/python3/dist-packages/ddl/_startup");
  CHECK(with_python_startup_hook({}, "ddl", prefix.executable()).at("PYTHONPATH") ==
        (prefix.root / "lib/python3/dist-packages/ddl/_startup").string());
}

TEST_CASE("--torch-backend refuses another backend, and a ddl with no Python package beside it, naming the flag") {
  ScratchPrefix bare("");
  CHECK_THROWS_WITH_AS(with_python_startup_hook({}, "nccl", bare.executable()), doctest::Contains("--torch-backend nccl"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(with_python_startup_hook({}, "ddl", bare.executable()),
                       doctest::Contains("ddl's Python package is not beside this ddl"), ddl::UsageError);
}

TEST_CASE("--torch-backend ddl refuses a Python whose flags keep the hook from running, naming the flag") {
  using Args = std::vector<std::string>;
  CHECK_THROWS_WITH_AS(check_python_runs_the_hook(Args{"python3", "-I", "train.py"}, "ddl"),
                       doctest::Contains("--torch-backend ddl: 'python3 -I' keeps ddl's start-up hook from running"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(check_python_runs_the_hook(Args{"/usr/bin/python3.11", "-uE", "train.py"}, "ddl"),
                       doctest::Contains("'/usr/bin/python3.11 -uE'"), ddl::UsageError);
  CHECK_THROWS_WITH_AS(check_python_runs_the_hook(Args{"python", "-W", "ignore", "-S", "-m", "pkg"}, "ddl"),
                       doctest::Contains("-S: no sitecustomize"), ddl::UsageError);
  // What is not Python's own flag is not looked at: the script's, -c's program, another program's.
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"python3", "train.py", "-I"}, "ddl"));
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"python3", "-c", "-I"}, "ddl"));
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"python3", "-Werror::-I", "train.py"}, "ddl"));
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"python3", "-X", "-S", "train.py"}, "ddl"));
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"./train", "-I"}, "ddl"));
  CHECK_NOTHROW(check_python_runs_the_hook(Args{"python3", "-I", "train.py"}, ""));  // no backend asked for
}
