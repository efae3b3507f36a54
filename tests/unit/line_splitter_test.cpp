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

TEST_CASE("an endless unfinished line goes out every 64 KiB instead of piling up, with no line end added") {
  const std::string chunk(size_t{40} * 1024, 'x');
  LineSplitter splitter;
  std::vector<std::pair<size_t, char>> pieces;
  auto sink = [&](std::string_view text, char end) { pieces.emplace_back(text.size(), end); };
  for (int i = 0; i < 3; ++i) splitter.feed(chunk, sink);
  REQUIRE(pieces.size() == 2);  // 80 KiB held: one full piece, the rest of it unfinished too
  CHECK(pieces[0] == std::pair<size_t, char>{64 * 1024, LineSplitter::kNoEnd});
  CHECK(pieces[1] == std::pair<size_t, char>{16 * 1024, LineSplitter::kNoEnd});
  splitter.feed("y\n", sink);
  CHECK(pieces.back() == std::pair<size_t, char>{40 * 1024 + 1, '\n'});
}

TEST_CASE("a line longer than the longest piece goes in pieces that make it up exactly, only the last with its end") {
  LineSplitter splitter(10);
  std::string joined;
  std::vector<char> ends;
  auto sink = [&](std::string_view text, char end) {
    CHECK(text.size() <= 10);
    joined.append(text);
    if (end != LineSplitter::kNoEnd) joined.push_back(end);
    ends.push_back(end);
  };
  const std::string line = "0123456789abcdefghijKLMNO";
  splitter.feed(line + "\nshort\n" + line.substr(0, 7), sink);
  splitter.feed(line, sink);  // an unfinished line that passes the limit: out in pieces too
  splitter.feed("\r", sink);
  splitter.feed("z", sink);
  splitter.finish(sink);
  CHECK(joined == line + "\nshort\n" + line.substr(0, 7) + line + "\rz\n");
  CHECK(ends == std::vector<char>{LineSplitter::kNoEnd, LineSplitter::kNoEnd, '\n', '\n', LineSplitter::kNoEnd, LineSplitter::kNoEnd,
                                  LineSplitter::kNoEnd, LineSplitter::kNoEnd, '\r', '\n'});
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

TEST_CASE("an endless unfinished line passed early: what follows goes out every 64 KiB, the passed part once") {
  LineSplitter splitter;
  size_t total = 0;
  auto sink = [&](std::string_view text, char) { total += text.size(); };
  splitter.feed(std::string(size_t{40} * 1024, 'x'), sink);
  splitter.pass_unfinished(sink);
  CHECK(total == 40 * 1024);
  splitter.feed(std::string(size_t{40} * 1024, 'x'), sink);
  CHECK(total == 40 * 1024);  // held: under 64 KiB not passed yet
  CHECK(splitter.has_unpassed_text());
  splitter.feed(std::string(size_t{30} * 1024, 'x'), sink);
  CHECK(total == 110 * 1024);
  CHECK_FALSE(splitter.has_unpassed_text());
}

TEST_CASE("rank prefixes") {
  CHECK(rank_prefix(0) == "[0] ");
  CHECK(rank_prefix(17) == "[17] ");
}
