// The built-in site profiles, compiled in from templates/sites/*.json (see backends/CMakeLists.txt).
#pragma once

#include <string_view>
#include <vector>

namespace ddl::backends {

struct BuiltinSite {
  std::string_view name;  // the file's stem
  std::string_view json;  // the file's text
};

const std::vector<BuiltinSite>& builtin_sites();

}  // namespace ddl::backends
