// Where the pieces of this ddl lie beside its executable: libddl and the Python package (with its
// start-up hook). The one place the launcher knows the install layout (CMake's DDL_INSTALL_* and a pip
// install's); the launcher never links libddl or imports the package, it finds them as a user's
// program would.
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

// libddl, for the launcher's own uses of it (check-build, the preflight probe): DDL_LIBRARY when set
// (as ddl's Python package honours it); else PREFIX/lib beside PREFIX/bin/ddl, then the build tree's
// runtime/ beside cli/ddl.
std::vector<std::string> libddl_candidates(const Environment& env);

// The first of libddl_candidates that loads (dlopen, RTLD_LOCAL) and has `must_have`, a call of its
// C API (an older libddl may lack it: the next candidate is tried). The handle stays open; nullptr
// when none does, with each candidate's reason, joined by "; ", in `why`.
void* open_libddl(const Environment& env, const char* must_have, std::string& why);

// The folders that may hold ddl's Python package (a folder with ddl/ in it) beside the ddl at
// `executable`, in the order to try them: the build tree (BUILD/python beside BUILD/cli/ddl), a
// `cmake --install` prefix (its DDL_INSTALL_PYTHONDIR), then a pip venv's or conda env's
// site-packages, Debian's pip's dist-packages and lib64 layouts (PREFIX/lib*/python3.X/*-packages).
std::vector<std::string> python_package_folders(const std::string& executable);

// The same folders' ddl/_startup, where the package keeps its start-up hook (sitecustomize.py).
std::vector<std::string> startup_hook_folders(const std::string& executable);

}  // namespace ddl::launcher
