#include "common/rank_ranges.hpp"

#include <fmt/format.h>

namespace ddl {

std::string rank_ranges(const std::vector<int>& sorted_ranks, std::string_view separator) {
  std::string text;
  for (size_t i = 0; i < sorted_ranks.size();) {
    size_t j = i;
    while (j + 1 < sorted_ranks.size() && sorted_ranks[j + 1] == sorted_ranks[j] + 1) ++j;
    if (!text.empty()) text += separator;
    text += j == i ? std::to_string(sorted_ranks[i]) : fmt::format("{}-{}", sorted_ranks[i], sorted_ranks[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace ddl
