#include "launcher/libddl_location.hpp"

#include <filesystem>

#include "ddl/build_features.hpp"
#include "launcher/host.hpp"

namespace ddl::launcher {

std::vector<std::string> libddl_candidates(const Environment& env) {
  if (auto explicit_path = lookup(env, "DDL_LIBRARY"); explicit_path && !explicit_path->empty()) return {*explicit_path};
  const auto bin = std::filesystem::path(this_executable()).parent_path();
  return {(bin / ".." / "lib" / DDL_LIBDDL_SONAME).lexically_normal().string(),       // PREFIX/bin/ddl, PREFIX/lib
          (bin / ".." / "runtime" / DDL_LIBDDL_SONAME).lexically_normal().string()};  // the build tree
}

}  // namespace ddl::launcher
