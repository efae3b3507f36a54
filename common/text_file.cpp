#include "common/text_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl {

std::string read_text_file(const std::string& path, const std::string& what, size_t most) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(fmt::format("{} {}: {}", what, path, std::strerror(errno)), "check the path and its permissions");
  if (S_ISDIR(st.st_mode)) throw UsageError(fmt::format("{} {}: is a directory, not a file", what, path), "give the file's path");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("{} {}: cannot read it", what, path), "check the path and its permissions");
  std::string text(most + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > most)
    throw UsageError(fmt::format("{} {}: is larger than {} bytes", what, path, most),
                     fmt::format("check that {} names the file you meant", what));
  return text;
}

}  // namespace ddl
