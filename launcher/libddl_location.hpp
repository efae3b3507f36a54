// Where this ddl's libddl lies, for the launcher's own uses of it (check-build, the preflight
// probe): the launcher never links libddl, it loads it as any program does.
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

// DDL_LIBRARY when set (as ddl's Python package honours it); else PREFIX/lib beside PREFIX/bin/ddl,
// then the build tree's runtime/ beside cli/ddl.
std::vector<std::string> libddl_candidates(const Environment& env);

}  // namespace ddl::launcher
