#include "cli/job_output.hpp"

#include <unistd.h>

#include <cstdio>
#include <deque>
#include <fstream>

#include <fmt/format.h>

#include "backends/jobs.hpp"

namespace ddl::cli {

std::string describe(const backends::JobState& s) {
  std::string line = fmt::format("job {} {}", s.id, s.state);
  if (!s.nodes.empty()) line += " on " + s.nodes;
  if (!s.reason.empty()) line += fmt::format(" ({})", s.reason);
  if (s.finished && s.exit_code) line += fmt::format(", exit code {}", *s.exit_code);
  return line;
}

void print_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  if (!in) {
    std::printf("(no output file at %s)\n", path.c_str());
    return;
  }
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::printf("--- last %zu lines of %s ---\n", tail.size(), path.c_str());
  for (const auto& line : tail) std::printf("%s\n", line.c_str());
}

// One status line that rewrites itself on a terminal, and one line per change elsewhere.
void print_job_status(const backends::JobState& s) {
  if (::isatty(STDOUT_FILENO))
    std::printf("\r\033[K%s", describe(s).c_str());
  else
    std::printf("%s\n", describe(s).c_str());
  std::fflush(stdout);
}

}  // namespace ddl::cli
