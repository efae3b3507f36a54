// How a host's agent relays its workers' output to the launching host of `ddl run -H`: every
// piece goes as a line of its own, labelled with the worker's rank. "rank: text" ends as the
// worker's line did ('\n', or '\r' for a redraw); "rank+ text\n" carries the text of an unfinished
// line passed before its end (LineSplitter::pass_unfinished), which later pieces continue.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "backends/launch_layout.hpp"

namespace ddl::launcher {

// The relayed form of `text` of `rank` with `end` ('\n', '\r' or LineSplitter::kNoEnd).
std::string relayed_piece(int rank, std::string_view text, char end);

// The text of an unfinished line ("rank+ text"), marked unfinished; nullopt for any other line.
std::optional<backends::TaskLine> relayed_unfinished_line(std::string_view line);

}  // namespace ddl::launcher
