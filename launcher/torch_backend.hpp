// `ddl run --torch-backend ddl`: every torch.distributed process group of the workers runs on
// libddl's backend, whatever backend the script names, with no change to the script.
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

// The folders where ddl's Python package may hold its startup hook (ddl/_startup), beside the ddl
// executable at `executable`: the build tree, a `cmake --install` prefix, a pip venv or conda env.
std::vector<std::string> torch_backend_hook_candidates(const std::string& executable);

// `env` with what makes the workers' Python use `backend` (only "ddl"; empty: `env` as it is):
// DDL_TORCH_BACKEND set and the hook's folder first on PYTHONPATH. Throws ddl::UsageError naming
// the flag when the backend is unknown or ddl's Python package is not beside `executable`.
Environment with_torch_backend(const Environment& env, const std::string& backend, const std::string& executable);

}  // namespace ddl::launcher
