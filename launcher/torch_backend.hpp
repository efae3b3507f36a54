// ddl's Python start-up hook (ddl/_startup/sitecustomize.py) in the workers of `ddl run`: torch's
// init_process_group("ddl") registers the backend itself; with `--torch-backend ddl` every
// torch.distributed process group of the workers runs on libddl's backend, whatever backend the
// script names, with no change to the script.
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

// `env` with the hook's folder first on PYTHONPATH, where ddl's Python package lies beside
// `executable` (else `env` as it is, when no backend is asked for), and with `backend` (only "ddl";
// empty: none) DDL_TORCH_BACKEND set. Throws ddl::UsageError naming the flag when the backend is
// unknown, or asked for while ddl's Python package is not beside `executable`.
Environment with_python_startup_hook(const Environment& env, const std::string& backend, const std::string& executable);

// With `backend` asked for (--torch-backend ddl), throws ddl::UsageError when `command` is a Python
// started with a flag that keeps the hook from running (-I, -E: PYTHONPATH ignored; -S: no
// sitecustomize), which would leave the script's own backend running without a word.
void check_python_runs_the_hook(const std::vector<std::string>& command, const std::string& backend);

}  // namespace ddl::launcher
