#include "launcher/install_layout.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddl/build_features.hpp"
#include "launcher/host.hpp"

namespace ddl::launcher {

namespace fs = std::filesystem;

std::vector<std::string> libddl_candidates(const Environment& env) {
  if (auto explicit_path = lookup(env, "DDL_LIBRARY"); explicit_path && !explicit_path->empty()) return {*explicit_path};
  const auto bin = fs::path(this_executable()).parent_path();
  return {(bin / ".." / "lib" / DDL_LIBDDL_SONAME).lexically_normal().string(),       // PREFIX/bin/ddl, PREFIX/lib
          (bin / ".." / "runtime" / DDL_LIBDDL_SONAME).lexically_normal().string()};  // the build tree
}

void* open_libddl(const Environment& env, const char* must_have, std::string& why) {
  std::vector<std::string> failures;
  for (const auto& path : libddl_candidates(env)) {
    void* libddl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (libddl == nullptr) {
      const char* error = ::dlerror();
      failures.push_back(error != nullptr ? error : path);
    } else if (::dlsym(libddl, must_have) == nullptr) {
      failures.push_back(fmt::format("{} is an older libddl without {}", path, must_have));
      ::dlclose(libddl);
    } else {
      return libddl;
    }
  }
  why = fmt::format("{}", fmt::join(failures, "; "));
  return nullptr;
}

std::vector<std::string> python_package_folders(const std::string& executable) {
  const fs::path prefix = (fs::path(executable).parent_path() / "..").lexically_normal();
  std::vector<std::string> found{(prefix / "python").string()};
  // Empty where pip installed ddl: the package is in the env's site-packages, found below.
  if (const fs::path installed = DDL_INSTALLED_PYTHONDIR; !installed.empty())
    found.push_back((prefix / installed).lexically_normal().string());
  std::vector<std::string> site_packages;
  for (const char* lib : {"lib", "lib64"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(prefix / lib, ec))
      if (entry.path().filename().string().starts_with("python3."))
        for (const char* packages : {"site-packages", "dist-packages"}) site_packages.push_back((entry.path() / packages).string());
  }
  std::sort(site_packages.begin(), site_packages.end());
  for (auto& folder : site_packages)
    if (std::find(found.begin(), found.end(), folder) == found.end()) found.push_back(std::move(folder));
  return found;
}

std::vector<std::string> startup_hook_folders(const std::string& executable) {
  std::vector<std::string> found = python_package_folders(executable);
  for (auto& folder : found) folder = (fs::path(folder) / "ddl" / "_startup").string();
  return found;
}

}  // namespace ddl::launcher
