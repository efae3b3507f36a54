// What a failed run's summary may add after a worker's last lines of stderr: a hint for a failure
// those lines show to be a common setup mistake rather than the program's own error.
#pragma once

#include <string>
#include <vector>

namespace ddl::launcher {

// A one-line hint for the failure `stderr_tail` shows, or "" when none applies. `ddl_program`: the
// path of the running ddl (its folder holds the Python of the environment ddl was installed in).
std::string failure_hint(const std::vector<std::string>& stderr_tail, const std::string& ddl_program);

}  // namespace ddl::launcher
