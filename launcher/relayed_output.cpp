#include "launcher/relayed_output.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "launcher/line_splitter.hpp"

namespace ddl::launcher {

namespace {
constexpr size_t kMostRankDigits = 9;
}  // namespace

std::string relayed_piece(int rank, std::string_view text, char end) {
  const char* mark = end == LineSplitter::kNoEnd ? "+" : end == '\r' ? "~" : ":";
  return fmt::format("{}{} {}\n", rank, mark, text);
}

std::string relayed_host(int rank, std::string_view host) { return fmt::format("{}@ {}\n", rank, host); }

std::string relayed_progress(int rank) { return fmt::format("{}* \n", rank); }

std::string relayed_end(int rank, int wait_status) { return fmt::format("{}= {}\n", rank, wait_status); }

std::string relayed_stacks(int rank, std::string_view stacks, std::string_view none_because) {
  std::string relayed;
  size_t start = 0;
  while (start < stacks.size()) {
    size_t end = stacks.find('\n', start);
    if (end == std::string_view::npos) end = stacks.size();
    std::string line(stacks.substr(start, std::min(end - start, kLongestRelayedText)));
    // A '\r' or another control character would end or garble the line on its way.
    std::replace_if(
        line.begin(), line.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 && c != '\t'; }, '?');
    relayed += fmt::format("{}# {}\n", rank, line);
    start = end + 1;
  }
  relayed += fmt::format("{}! {}\n", rank, none_because);
  return relayed;
}

std::optional<backends::TaskLine> relayed_line(std::string_view line) {
  size_t digits = 0;
  int rank = 0;
  while (digits < line.size() && digits < kMostRankDigits && std::isdigit(static_cast<unsigned char>(line[digits])))
    rank = rank * 10 + (line[digits++] - '0');
  if (digits == 0 || digits + 1 >= line.size() || line[digits + 1] != ' ') return std::nullopt;
  backends::TaskLine task{rank, std::string(line.substr(digits + 2))};
  switch (line[digits]) {
    case ':': return task;
    case '+': task.unfinished = true; return task;
    case '~': task.redrawn = true; return task;
    case '@': task.notice = backends::TaskLine::Notice::kHost; return task;
    case '*': task.notice = backends::TaskLine::Notice::kProgress; return task;
    case '#': task.notice = backends::TaskLine::Notice::kStack; return task;
    case '!': task.notice = backends::TaskLine::Notice::kStacksEnd; return task;
    case '=': task.notice = backends::TaskLine::Notice::kEnded; return task;
    default: return std::nullopt;
  }
}

bool starts_relayed_line(int rank, std::string_view text) {
  auto inner = relayed_line(text);
  if (!inner && text.starts_with(' ')) inner = relayed_line(text.substr(1));
  return inner && inner->rank == rank;
}

backends::TaskLine unwrapped(backends::TaskLine task) {
  auto inner = relayed_line(task.text);
  // OpenMPI 5 tags "[1,0]<stdout>: " with a blank after the colon, 4.1 without.
  if (!inner && task.text.starts_with(' ')) inner = relayed_line(std::string_view(task.text).substr(1));
  if (!inner || inner->rank != task.rank) return task;
  return *inner;
}

std::vector<std::string> whole_lines_of(int rank, const std::vector<backends::TaskLine>& tasks, size_t most) {
  std::vector<std::string> lines;
  std::string line;
  for (const auto& task : tasks) {
    if (task.rank != rank || task.notice != backends::TaskLine::Notice::kNone) continue;
    line += task.text;
    if (task.unfinished) continue;
    if (!task.redrawn) lines.push_back(line);
    line.clear();
  }
  if (!line.empty()) lines.push_back(line);
  if (lines.size() > most) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(most));
  return lines;
}

}  // namespace ddl::launcher
