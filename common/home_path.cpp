#include "common/home_path.hpp"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace ddl {

namespace {

// The home folder of `user` ("" for this user: $HOME, else the password database's), "" when unknown.
std::string home_of(const std::string& user) {
  if (user.empty()) {
    const char* home = std::getenv("HOME");
    if (home != nullptr && *home != '\0') return home;
  }
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  const int error = user.empty() ? ::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found)
                                 : ::getpwnam_r(user.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0 || found == nullptr || found->pw_dir == nullptr) return {};
  return found->pw_dir;
}

}  // namespace

std::string with_home_expanded(const std::string& path) {
  if (!path.starts_with('~')) return path;
  const size_t slash = path.find('/');
  const std::string user = path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
  const std::string home = home_of(user);
  if (home.empty()) return path;
  return slash == std::string::npos ? home : home + path.substr(slash);
}

}  // namespace ddl
