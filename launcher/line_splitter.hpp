// Cuts a byte stream into whole lines, so each line of a worker reaches ddl's output in one piece.
// A carriage return ends a line too (tqdm-style progress bars redraw with '\r' and no '\n'), so
// such updates go out as they come rather than when the worker exits; "\r\n" is one line end.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ddl::launcher {

class LineSplitter {
 public:
  // The line without its end, and the end: '\n', or '\r' for a line redrawn in place.
  using LineSink = std::function<void(std::string_view line, char end)>;
  // An unfinished line this long goes out as a line of its own, so none is held without limit.
  static constexpr size_t kLongestLine = size_t{64} * 1024;

  // Passes every line completed by `data` to `sink`; keeps an unfinished last line for later.
  void feed(std::string_view data, const LineSink& sink);
  // At end of stream: passes the unfinished last line, if any.
  void finish(const LineSink& sink);

 private:
  void complete(std::string_view tail, char end, const LineSink& sink);

  std::string partial_;
  bool carriage_return_pending_ = false;  // the last read ended with '\r': "\r\n" or a redraw?
};

// "[rank] " — the prefix of each output line of a worker.
std::string rank_prefix(int rank);

}  // namespace ddl::launcher
