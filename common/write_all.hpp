// Writing a whole buffer to a file descriptor, across partial writes and EINTR. Allocates nothing,
// so a fork()ed child may call it before exec.
#pragma once

#include <string_view>

namespace ddl {

// False when a write failed (errno says why: a full disk, a pipe whose reader has gone, ...).
bool write_all(int fd, std::string_view data);

}  // namespace ddl
