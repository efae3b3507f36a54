// Facts about this host that the launcher needs.
#pragma once

#include <string>

namespace ddl::launcher {

std::string host_name();
// CPUs this process may run on (its affinity mask), at least 1.
int available_cpus();
// `bytes` random bytes from the kernel, as lowercase hex.
std::string random_hex(size_t bytes);
// Raises the soft limit on open files to the hard limit (the store holds one per client).
void raise_open_file_limit();

}  // namespace ddl::launcher
