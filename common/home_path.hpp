// A path given as `--flag=~/x`, where the shell leaves the `~` alone (it expands a tilde at the start
// of a word or of an assignment, not after a flag's `=`).
#pragma once

#include <string>

namespace ddl {

// `path` as the shell would have expanded it: `~` and `~/...` under $HOME, `~name` and `~name/...`
// under that user's home. Anything else, and a `~name` with no such user, is returned unchanged
// (as the shell leaves it).
std::string with_home_expanded(const std::string& path);

}  // namespace ddl
