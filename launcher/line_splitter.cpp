#include "launcher/line_splitter.hpp"

#include <fmt/format.h>

namespace ddl::launcher {

// Passes partial_ + tail as the end of the line (the part passed before not again). An empty
// redraw ('\r' right after a line end) is dropped.
void LineSplitter::complete(std::string_view tail, char end, const LineSink& sink) {
  if (partial_.empty() && !line_open_) {
    if (!(end == '\r' && tail.empty())) pass(tail, end, sink);
    return;
  }
  partial_.append(tail);
  pass(partial_, end, sink);
  partial_.clear();
  line_open_ = false;
}

void LineSplitter::pass(std::string_view text, char end, const LineSink& sink) const {
  while (text.size() > longest_piece_) {
    sink(text.substr(0, longest_piece_), kNoEnd);
    text.remove_prefix(longest_piece_);
  }
  sink(text, end);
}

void LineSplitter::feed(std::string_view data, const LineSink& sink) {
  if (carriage_return_pending_ && !data.empty()) {
    carriage_return_pending_ = false;
    const bool crlf = data.front() == '\n';
    complete({}, crlf ? '\n' : '\r', sink);
    if (crlf) data.remove_prefix(1);
  }
  while (!data.empty()) {
    auto at = data.find_first_of("\r\n");
    if (at == std::string_view::npos) {
      partial_.append(data);
      if (partial_.size() >= longest_piece_) pass_unfinished(sink);
      return;
    }
    if (data[at] == '\r' && at + 1 == data.size()) {  // "\r\n" cut between reads, or a redraw: the next read tells
      partial_.append(data.substr(0, at));
      carriage_return_pending_ = true;
      return;
    }
    const bool crlf = data[at] == '\r' && data[at + 1] == '\n';
    complete(data.substr(0, at), crlf || data[at] == '\n' ? '\n' : '\r', sink);
    data.remove_prefix(at + (crlf ? 2 : 1));
  }
}

void LineSplitter::pass_unfinished(const LineSink& sink) {
  if (partial_.empty()) return;
  pass(partial_, kNoEnd, sink);
  partial_.clear();
  line_open_ = true;
}

void LineSplitter::finish(const LineSink& sink) {
  carriage_return_pending_ = false;
  if (partial_.empty() && !line_open_) return;
  pass(partial_, '\n', sink);
  partial_.clear();
  line_open_ = false;
}

std::string rank_prefix(int rank) { return fmt::format("[{}] ", rank); }

}  // namespace ddl::launcher
