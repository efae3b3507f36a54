// Reading a small text file that a user or a scheduler names (a hostfile, PBS_NODEFILE, a site profile).
#pragma once

#include <cstddef>
#include <string>

namespace ddl {

// The text of `path`, which `what` names in errors ("--hostfile", "PBS_NODEFILE"): a UsageError
// for a directory, or for more than `most` bytes (/dev/zero would never end). A pipe is read as
// a file is (`--hostfile <(...)`).
std::string read_text_file(const std::string& path, const std::string& what, size_t most = 16 << 20);

}  // namespace ddl
