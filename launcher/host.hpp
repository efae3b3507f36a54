// Facts about this host that the launcher needs.
#pragma once

#include <string>

namespace ddl::launcher {

std::string host_name();
std::string full_host_name();
// The path of this ddl binary, for the commands and scripts that run it again.
std::string this_executable();
// CPUs this process may run on (its affinity mask), at least 1.
int available_cpus();
// Whether `name` (a host name or address) is this host: its own name, localhost, or a name that
// resolves to an address of one of this host's interfaces.
bool is_this_host(const std::string& name);
// address_towards(host): common/net_address.hpp
// Raises the soft limit on open files to the hard limit (the store holds one per client).
void raise_open_file_limit();

}  // namespace ddl::launcher
