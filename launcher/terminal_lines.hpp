// What one of ddl's outputs (a terminal, usually) shows of the workers' lines while pieces of them
// arrive: a line passed before its end (LineSplitter::pass_unfinished) or one just redrawn ('\r')
// stays open on the output. Its own source continues it; any other source's text first ends it
// with a newline, so that lines of different sources never mix and each line has one prefix.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace ddl::launcher {

class TerminalLines {
 public:
  // Where text comes from: (stream, rank); a task launcher's stream carries several ranks.
  using Source = std::pair<int, int>;

  // The bytes that show `text` of `source` followed by `end`: '\n', '\r', or LineSplitter::kNoEnd
  // for text whose line goes on later. `prefix` ("[rank] " or empty) starts each new line.
  std::string show(Source source, std::string_view prefix, std::string_view text, char end);

  // A newline if a line is open (before ddl's own words, at the end of a run), else nothing.
  std::string end_open_line();

 private:
  struct OpenLine {
    Source source;
    bool redrawn = false;  // ended by '\r': the cursor is at its start, its next text overwrites it
  };

  std::optional<OpenLine> open_;
  std::set<Source> ended_early_;  // sources whose unfinished line another source's text ended
};

}  // namespace ddl::launcher
