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

}  // namespace ddl::launcher
