#include "launcher/relayed_output.hpp"

#include <cctype>

#include <fmt/format.h>

#include "launcher/line_splitter.hpp"

namespace ddl::launcher {

namespace {
constexpr std::string_view kUnfinishedMark = "+ ";
constexpr size_t kMostRankDigits = 9;
}  // namespace

std::string relayed_piece(int rank, std::string_view text, char end) {
  if (end == LineSplitter::kNoEnd) return fmt::format("{}{}{}\n", rank, kUnfinishedMark, text);
  return fmt::format("{}: {}{}", rank, text, end);
}

std::optional<backends::TaskLine> relayed_unfinished_line(std::string_view line) {
  size_t digits = 0;
  int rank = 0;
  while (digits < line.size() && digits < kMostRankDigits && std::isdigit(static_cast<unsigned char>(line[digits])))
    rank = rank * 10 + (line[digits++] - '0');
  if (digits == 0 || !line.substr(digits).starts_with(kUnfinishedMark)) return std::nullopt;
  return backends::TaskLine{rank, std::string(line.substr(digits + kUnfinishedMark.size())), true};
}

}  // namespace ddl::launcher
