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

TEST_CASE("rank prefixes") {
  CHECK(rank_prefix(0) == "[0] ");
  CHECK(rank_prefix(17) == "[17] ");
}
