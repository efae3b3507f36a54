// The escape that carries a user's lone ":" words through srun/mpirun/mpiexec (MPMD separators).
#include <doctest/doctest.h>

#include "launcher/program_separators.hpp"

using namespace ddl::launcher;

TEST_CASE("a lone ':' and its backslashed forms gain one backslash; other words stay as they are") {
  const std::vector<std::string> words{"python3", ":", "\\:", "\\\\:", "a:", ":b", "::", "\\", "", "x\\:", ":\\"};
  const std::vector<std::string> escaped{"python3", "\\:", "\\\\:", "\\\\\\:", "a:", ":b", "::", "\\", "", "x\\:", ":\\"};
  CHECK(escape_program_separators(words) == escaped);
  for (const auto& word : escape_program_separators(words)) CHECK(word != ":");
}

TEST_CASE("unescaping gives back exactly the words that were escaped") {
  const std::vector<std::string> words{":", "\\:", "\\\\\\:", "-np", ":", "--", "", "\\"};
  CHECK(unescape_program_separators(escape_program_separators(words)) == words);
}
