// `ddl run --ranks 0,4-7`: the ranks whose output reaches the terminal.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddl::launcher {

class RankSelection {
 public:
  // Ranks and ranges, comma-separated ("0,4-7"); throws UsageError naming --ranks and the bad part.
  static RankSelection parse(std::string_view text);
  // No rank's output on the terminal (ddl run's preflight probes; a failure is still said).
  static RankSelection none() { return RankSelection(); }
  bool shows(int rank) const;
  // Throws UsageError when a selected rank is not in a world of `world_size` ranks.
  void check_within(int world_size) const;
  const std::string& text() const { return text_; }

 private:
  struct Range {
    int first, last;
  };
  std::vector<Range> ranges_;
  std::string text_;
};

}  // namespace ddl::launcher
