#include "launcher/line_splitter.hpp"

#include <fmt/format.h>

namespace ddl::launcher {

// Passes partial_ + tail as one line (less what pass_unfinished passed of it). An empty redraw
// ('\r' right after a line end) is dropped.
void LineSplitter::complete(std::string_view tail, char end, const LineSink& sink) {
  if (partial_.empty()) {
    if (!(end == '\r' && tail.empty())) sink(tail, end);
    return;
  }
  partial_.append(tail);
  sink(unpassed(), end);
  partial_.clear();
  passed_ = 0;
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
      if (partial_.size() >= kLongestLine) complete({}, '\n', sink);
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
  if (!has_unpassed_text()) return;
  sink(unpassed(), kNoEnd);
  passed_ = partial_.size();
}

void LineSplitter::finish(const LineSink& sink) {
  carriage_return_pending_ = false;
  if (partial_.empty()) return;
  sink(unpassed(), '\n');
  partial_.clear();
  passed_ = 0;
}

std::string rank_prefix(int rank) { return fmt::format("[{}] ", rank); }

}  // namespace ddl::launcher
