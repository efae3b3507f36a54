#include "launcher/line_splitter.hpp"

#include <fmt/format.h>

namespace ddl::launcher {

void LineSplitter::feed(std::string_view data, const LineSink& sink) {
  while (!data.empty()) {
    auto newline = data.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(data);
      return;
    }
    if (partial_.empty()) {
      sink(data.substr(0, newline));
    } else {
      partial_.append(data.substr(0, newline));
      sink(partial_);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
}

void LineSplitter::finish(const LineSink& sink) {
  if (partial_.empty()) return;
  sink(partial_);
  partial_.clear();
}

std::string rank_prefix(int rank) { return fmt::format("[{}] ", rank); }

}  // namespace ddl::launcher
