#include "common/random_hex.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/hex.hpp"

namespace ddl {

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(fmt::format("cannot read random bytes: {}", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  return to_hex(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
}

}  // namespace ddl
