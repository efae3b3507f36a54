// Cuts a byte stream into whole lines, so each line of a worker reaches ddl's output in one piece.
// A carriage return ends a line too (tqdm-style progress bars redraw with '\r' and no '\n'), so
// such updates go out as they come rather than when the worker exits; "\r\n" is one line end.
// An unfinished line can be passed before its end (pass_unfinished: a prompt, a progress bar's
// current state); what comes later continues it, and only the part not passed yet is passed then.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ddl::launcher {

class LineSplitter {
 public:
  // The end of text passed by pass_unfinished: its line goes on later.
  static constexpr char kNoEnd = '\0';
  // The line, without the part passed before, and its end: '\n', '\r' for a line redrawn in
  // place, or kNoEnd.
  using LineSink = std::function<void(std::string_view text, char end)>;
  // An unfinished line this long goes out as a line of its own, so none is held without limit.
  static constexpr size_t kLongestLine = size_t{64} * 1024;

  // Passes every line completed by `data` to `sink`; keeps an unfinished last line for later.
  void feed(std::string_view data, const LineSink& sink);
  // Whether the unfinished line has text that has not been passed yet.
  bool has_unpassed_text() const { return partial_.size() > passed_; }
  // Passes that text, ending kNoEnd.
  void pass_unfinished(const LineSink& sink);
  // At end of stream: passes the unfinished last line, if any.
  void finish(const LineSink& sink);

 private:
  void complete(std::string_view tail, char end, const LineSink& sink);
  std::string_view unpassed() const { return std::string_view(partial_).substr(passed_); }

  std::string partial_;
  size_t passed_ = 0;                     // bytes of partial_ already passed by pass_unfinished
  bool carriage_return_pending_ = false;  // the last read ended with '\r': "\r\n" or a redraw?
};

// "[rank] " — the prefix of each output line of a worker.
std::string rank_prefix(int rank);

}  // namespace ddl::launcher
