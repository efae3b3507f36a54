#include "backends/launch_layout.hpp"

#include <cctype>

namespace ddl::backends {

std::optional<TaskLine> rank_colon_label(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t digits = i;
  int rank = 0;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && i - digits < 9) rank = rank * 10 + (line[i++] - '0');
  if (i == digits || i >= line.size() || line[i] != ':') return std::nullopt;
  ++i;
  if (i < line.size() && line[i] == ' ') ++i;
  return TaskLine{rank, std::string(line.substr(i))};
}

}  // namespace ddl::backends
