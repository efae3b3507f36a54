#include "launcher/terminal_lines.hpp"

#include "launcher/line_splitter.hpp"

namespace ddl::launcher {

std::string TerminalLines::end_open_line() {
  if (!open_) return {};
  if (!open_->redrawn) ended_early_.insert(open_->source);
  open_.reset();
  return "\n";
}

std::string TerminalLines::show(Source source, std::string_view prefix, std::string_view text, char end) {
  std::string out;
  if (open_ && open_->source != source) out = end_open_line();
  // The end of a line that another source's text already ended: that newline has been written.
  if (ended_early_.erase(source) != 0 && text.empty() && end != LineSplitter::kNoEnd) return out;
  if (text.empty() && end == LineSplitter::kNoEnd) return out;
  const bool continues = open_ && !open_->redrawn;  // open_, if any, is this source's line now
  if (!continues) out.append(prefix);
  out.append(text);
  if (end == LineSplitter::kNoEnd) {
    open_ = OpenLine{source, false};
    return out;
  }
  out.push_back(end);
  if (end == '\r')
    open_ = OpenLine{source, true};
  else
    open_.reset();
  return out;
}

}  // namespace ddl::launcher
