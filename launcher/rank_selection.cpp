#include "launcher/rank_selection.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl::launcher {

namespace {

constexpr const char* kForm = "give ranks and ranges, comma-separated: --ranks 0,4-7";

int rank_of(std::string_view digits, std::string_view whole) {
  int value = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0)
    throw UsageError(fmt::format("--ranks '{}': '{}' is not a rank", whole, digits), kForm);
  return value;
}

}  // namespace

RankSelection RankSelection::parse(std::string_view text) {
  RankSelection selection;
  selection.text_ = text;
  if (text.empty()) throw UsageError("--ranks is empty", kForm);
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view part = text.substr(start, comma - start);
    const size_t dash = part.find('-');
    Range range{};
    if (dash == std::string_view::npos) {
      range.first = range.last = rank_of(part, text);
    } else {
      range.first = rank_of(part.substr(0, dash), text);
      range.last = rank_of(part.substr(dash + 1), text);
      if (range.last < range.first) throw UsageError(fmt::format("--ranks '{}': the range '{}' ends before it starts", text, part), kForm);
    }
    selection.ranges_.push_back(range);
    start = comma + 1;
  }
  return selection;
}

bool RankSelection::shows(int rank) const {
  return std::any_of(ranges_.begin(), ranges_.end(), [&](const Range& r) { return rank >= r.first && rank <= r.last; });
}

void RankSelection::check_within(int world_size) const {
  for (const Range& r : ranges_)
    if (r.first >= world_size)
      throw UsageError(fmt::format("--ranks {}: rank {} is not in this run, whose ranks are 0-{}", text_, r.first, world_size - 1),
                       "name ranks below the number of workers (-np)");
}

}  // namespace ddl::launcher
