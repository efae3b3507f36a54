// Cuts a byte stream into whole lines, so each line of a worker reaches ddl's output in one piece.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace ddl::launcher {

class LineSplitter {
 public:
  using LineSink = std::function<void(std::string_view line)>;  // the line without its '\n'

  // Passes every line completed by `data` to `sink`; keeps an unfinished last line for later.
  void feed(std::string_view data, const LineSink& sink);
  // At end of stream: passes the unfinished last line, if any.
  void finish(const LineSink& sink);

 private:
  std::string partial_;
};

// "[rank] " — the prefix of each output line of a worker.
std::string rank_prefix(int rank);

}  // namespace ddl::launcher
