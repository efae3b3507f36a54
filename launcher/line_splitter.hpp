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
  // The longest piece passed at once by default: an unfinished line this long is passed (kNoEnd)
  // rather than held without limit, and a longer line goes in pieces of this size, all but the last
  // unfinished, so that the bytes arrive as they were, with no line end added.
  static constexpr size_t kLongestLine = size_t{64} * 1024;

  explicit LineSplitter(size_t longest_piece = kLongestLine) : longest_piece_(longest_piece) {}

  // Passes every line completed by `data` to `sink`; keeps an unfinished last line for later.
  void feed(std::string_view data, const LineSink& sink);
  // Whether the unfinished line has text that has not been passed yet.
  bool has_unpassed_text() const { return !partial_.empty(); }
  // Passes that text, ending kNoEnd.
  void pass_unfinished(const LineSink& sink);
  // At end of stream: passes the unfinished last line, if any.
  void finish(const LineSink& sink);

 private:
  void complete(std::string_view tail, char end, const LineSink& sink);
  void pass(std::string_view text, char end, const LineSink& sink) const;

  size_t longest_piece_;
  std::string partial_;                   // the unfinished line's text not passed yet
  bool line_open_ = false;                // part of the unfinished line has been passed (kNoEnd)
  bool carriage_return_pending_ = false;  // the last read ended with '\r': "\r\n" or a redraw?
};

// "[rank] " — the prefix of each output line of a worker.
std::string rank_prefix(int rank);

}  // namespace ddl::launcher
