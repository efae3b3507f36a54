// srun, mpirun and mpiexec read a lone ":" anywhere on their command line as the start of another
// program (MPMD): a user's argument ":" would vanish, or start a program of its own. The user's
// command crosses them with every such word escaped by one more backslash, and `ddl exec
// --escaped-separators` takes the backslash off again, so the worker gets its arguments unchanged.
#pragma once

#include <string>
#include <vector>

namespace ddl::launcher {

// ":" -> "\:", "\:" -> "\\:", ...; every other word as it is. No word of the result is ":".
std::vector<std::string> escape_program_separators(std::vector<std::string> words);

// The inverse of escape_program_separators.
std::vector<std::string> unescape_program_separators(std::vector<std::string> words);

}  // namespace ddl::launcher
