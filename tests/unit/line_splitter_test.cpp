#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "launcher/line_splitter.hpp"

using namespace ddl::launcher;

namespace {
std::vector<std::string> split_all(const std::vector<std::string>& chunks, bool finish) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto sink = [&](std::string_view line, char end) { lines.emplace_back(std::string(line) + (end == '\r' ? "<CR>" : "")); };
  for (const auto& c : chunks) splitter.feed(c, sink);
  if (finish) splitter.finish(sink);
  return lines;
}
}  // namespace

TEST_CASE("a line cut across reads comes out whole, once") {
  CHECK(split_all({"hel", "lo\nwor", "ld\n"}, false) == std::vector<std::string>{"hello", "world"});
}

TEST_CASE("several lines in one read come out separately, empty lines included") {
  CHECK(split_all({"a\n\nb\n"}, false) == std::vector<std::string>{"a", "", "b"});
}

TEST_CASE("an unfinished last line waits for the end of the stream") {
  CHECK(split_all({"done\npart"}, false) == std::vector<std::string>{"done"});
  CHECK(split_all({"done\npart"}, true) == std::vector<std::string>{"done", "part"});
  CHECK(split_all({}, true).empty());
}

TEST_CASE("a progress bar's carriage-return redraws go out as they come, and CRLF is one line end") {
  // tqdm: "\r" before each redraw, a newline at the end.
  CHECK(split_all({"\r  1%|", "\r 50%|", "\r100%|\n"}, false) == std::vector<std::string>{"  1%|<CR>", " 50%|<CR>", "100%|"});
  CHECK(split_all({"a\r\nb\r\n"}, false) == std::vector<std::string>{"a", "b"});
  CHECK(split_all({"a\r", "\nb\r", "c\n"}, false) == std::vector<std::string>{"a", "b<CR>", "c"});  // CRLF cut between reads
  CHECK(split_all({"tail\r"}, true) == std::vector<std::string>{"tail"});
}

TEST_CASE("an endless unfinished line goes out every 64 KiB instead of piling up") {
  const std::string chunk(size_t{40} * 1024, 'x');
  auto lines = split_all({chunk, chunk, chunk}, false);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].size() == 80 * 1024);
}

namespace {
// Feeds each chunk; "|" passes the unfinished line. Pieces passed early end in "<...>".
std::vector<std::string> pieces_of(const std::vector<std::string>& chunks) {
  LineSplitter splitter;
  std::vector<std::string> pieces;
  auto sink = [&](std::string_view text, char end) {
    pieces.emplace_back(std::string(text) + (end == '\r' ? "<CR>" : end == LineSplitter::kNoEnd ? "<...>" : ""));
  };
  for (const auto& c : chunks) {
    if (c == "|")
      splitter.pass_unfinished(sink);
    else
      splitter.feed(c, sink);
  }
  splitter.finish(sink);
  return pieces;
}
}  // namespace

TEST_CASE("an unfinished line passed early: only the rest follows at its end") {
  CHECK(pieces_of({"Load", "ing...", "|", " done\n"}) == std::vector<std::string>{"Loading...<...>", " done"});
  CHECK(pieces_of({"a", "|", "b", "|", "c\n"}) == std::vector<std::string>{"a<...>", "b<...>", "c"});
  CHECK(pieces_of({"a", "|", "|", "\n"}) == std::vector<std::string>{"a<...>", ""});  // nothing new: nothing passed
  CHECK(pieces_of({"|", "x\n", "|"}) == std::vector<std::string>{"x"});               // no unfinished line: nothing
  CHECK(pieces_of({"tail", "|"}) == std::vector<std::string>{"tail<...>", ""});       // the end of stream ends it, no text twice
}

TEST_CASE("has_unpassed_text says whether pass_unfinished would pass anything") {
  LineSplitter splitter;
  auto ignore = [](std::string_view, char) {};
  CHECK_FALSE(splitter.has_unpassed_text());
  splitter.feed("abc", ignore);
  CHECK(splitter.has_unpassed_text());
  splitter.pass_unfinished(ignore);
  CHECK_FALSE(splitter.has_unpassed_text());
  splitter.feed("d", ignore);
  CHECK(splitter.has_unpassed_text());
  splitter.feed("\n", ignore);
  CHECK_FALSE(splitter.has_unpassed_text());
}

TEST_CASE("a progress bar's current state passed early: its redraw keeps the '\\r', with no text twice") {
  // tqdm: "\r" and the bar; the current bar waits for the next "\r" unless passed early.
  CHECK(pieces_of({"\r 10%", "|", "\r 20%", "|", "\r 30%\n"}) ==
        std::vector<std::string>{" 10%<...>", "<CR>", " 20%<...>", "<CR>", " 30%"});
  // a read that ends in '\r': the text before it is passed, the '\r' still waits to tell CRLF from a redraw
  CHECK(pieces_of({"a\r", "|", "\nb"}) == std::vector<std::string>{"a<...>", "", "b"});
  CHECK(pieces_of({"a\r", "|", "b\n"}) == std::vector<std::string>{"a<...>", "<CR>", "b"});
}

TEST_CASE("an endless unfinished line passed early still goes out every 64 KiB, the passed part once") {
  LineSplitter splitter;
  size_t total = 0;
  auto sink = [&](std::string_view text, char) { total += text.size(); };
  splitter.feed(std::string(size_t{40} * 1024, 'x'), sink);
  splitter.pass_unfinished(sink);
  CHECK(total == 40 * 1024);
  splitter.feed(std::string(size_t{40} * 1024, 'x'), sink);
  CHECK(total == 80 * 1024);
  CHECK_FALSE(splitter.has_unpassed_text());
}

TEST_CASE("rank prefixes") {
  CHECK(rank_prefix(0) == "[0] ");
  CHECK(rank_prefix(17) == "[17] ");
}
