#include <doctest/doctest.h>

#include <string>

#include "launcher/line_splitter.hpp"
#include "launcher/terminal_lines.hpp"

using namespace ddl::launcher;

namespace {
constexpr char kNoEnd = LineSplitter::kNoEnd;
const TerminalLines::Source rank0{0, 0};
const TerminalLines::Source rank1{2, 1};
}  // namespace

TEST_CASE("an unfinished line shows with its prefix, and its continuation and end follow without a second prefix") {
  TerminalLines out;
  CHECK(out.show(rank0, "[0] ", "Loading...", kNoEnd) == "[0] Loading...");
  CHECK(out.show(rank0, "[0] ", " still", kNoEnd) == " still");
  CHECK(out.show(rank0, "[0] ", " done", '\n') == " done\n");
  CHECK(out.show(rank0, "[0] ", "next", '\n') == "[0] next\n");
  CHECK(out.end_open_line().empty());
}

TEST_CASE("another rank's text first ends the open unfinished line, and the rank goes on on a fresh prefixed line") {
  TerminalLines out;
  CHECK(out.show(rank0, "[0] ", "Loading...", kNoEnd) == "[0] Loading...");
  CHECK(out.show(rank1, "[1] ", "hello", '\n') == "\n[1] hello\n");
  CHECK(out.show(rank0, "[0] ", " done", '\n') == "[0]  done\n");
}

TEST_CASE("two ranks' unfinished lines never share a line") {
  TerminalLines out;
  std::string shown;
  shown += out.show(rank0, "[0] ", "a0 ", kNoEnd);
  shown += out.show(rank1, "[1] ", "a1 ", kNoEnd);
  shown += out.show(rank0, "[0] ", "b0 ", kNoEnd);
  shown += out.show(rank0, "[0] ", "c0 ", kNoEnd);
  shown += out.show(rank1, "[1] ", "b1", '\n');
  shown += out.show(rank0, "[0] ", "", '\n');  // its line end: another rank's text already ended the line
  CHECK(shown == "[0] a0 \n[1] a1 \n[0] b0 c0 \n[1] b1\n");
  CHECK(out.show(rank0, "[0] ", "x", '\n') == "[0] x\n");
}

TEST_CASE("carriage-return redraws overwrite the rank's own line; another rank's text keeps it and starts below") {
  TerminalLines out;
  // tqdm: each update is '\r' and the bar; the splitter passes the text still waiting for its '\r'.
  CHECK(out.show(rank0, "[0] ", " 10%", kNoEnd) == "[0]  10%");
  CHECK(out.show(rank0, "[0] ", "", '\r') == "\r");
  CHECK(out.show(rank0, "[0] ", " 20%", kNoEnd) == "[0]  20%");
  CHECK(out.show(rank0, "[0] ", "", '\r') == "\r");
  CHECK(out.show(rank1, "[1] ", " 10%", kNoEnd) == "\n[1]  10%");
  CHECK(out.show(rank0, "[0] ", " 30%", '\r') == "\n[0]  30%\r");
  CHECK(out.end_open_line() == "\n");
  CHECK(out.end_open_line().empty());
}

TEST_CASE("an unfinished line ended by another rank before its redraw is not ended twice") {
  TerminalLines out;
  CHECK(out.show(rank0, "[0] ", " 10%", kNoEnd) == "[0]  10%");
  CHECK(out.show(rank1, "[1] ", "x", '\n') == "\n[1] x\n");
  CHECK(out.show(rank0, "[0] ", "", '\r').empty());
  CHECK(out.show(rank0, "[0] ", " 20%", '\r') == "[0]  20%\r");
}

TEST_CASE("without prefixes the same: continuations glued to their line, other ranks' text on a line of its own") {
  TerminalLines out;
  CHECK(out.show(rank0, "", "Loading...", kNoEnd) == "Loading...");
  CHECK(out.show(rank0, "", " done", '\n') == " done\n");
  CHECK(out.show(rank0, "", "again...", kNoEnd) == "again...");
  CHECK(out.show(rank1, "", "other", '\n') == "\nother\n");
  CHECK(out.show(rank0, "", " done", '\n') == " done\n");
}

TEST_CASE("the two streams of one rank are two sources: stderr's line ends stdout's unfinished one") {
  TerminalLines out;
  const TerminalLines::Source out0{0, 0}, err0{1, 0};
  CHECK(out.show(out0, "[0] ", "Loading...", kNoEnd) == "[0] Loading...");
  CHECK(out.show(err0, "[0] ", "warning", '\n') == "\n[0] warning\n");
  CHECK(out.show(out0, "[0] ", " done", '\n') == "[0]  done\n");
}

TEST_CASE("whole lines pass as they are") {
  TerminalLines out;
  CHECK(out.show(rank0, "[0] ", "a", '\n') == "[0] a\n");
  CHECK(out.show(rank1, "[1] ", "b", '\n') == "[1] b\n");
  CHECK(out.show(rank1, "[1] ", "", '\n') == "[1] \n");  // an empty line of its own
  CHECK(out.show(rank0, "[0] ", "", kNoEnd).empty());
}
