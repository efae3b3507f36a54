// Ranks written as runs, as messages name them: "0-6,8-15".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddl {

// `sorted_ranks` as runs joined by `separator`: {0, ..., 6, 8, 9} -> "0-6" + separator + "8-9".
std::string rank_ranges(const std::vector<int>& sorted_ranks, std::string_view separator = ",");

}  // namespace ddl
