// Network addresses shared by the launcher and libddl.
#pragma once

#include <string>

namespace ddl {

// This host's IPv4 address on the route towards `host`: the one `host` can reach it at (a host
// name may resolve to 127.0.1.1 on Debian, which no other host can reach). Throws ddl::Error
// naming `host` when it does not resolve or no route leads there.
std::string address_towards(const std::string& host);

}  // namespace ddl
