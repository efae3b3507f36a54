#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launcher/line_splitter.hpp"

using namespace ddl::launcher;

namespace {
std::vector<std::string> split_all(const std::vector<std::string>& chunks, bool finish) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto sink = [&](std::string_view line) { lines.emplace_back(line); };
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

TEST_CASE("rank prefixes") {
  CHECK(rank_prefix(0) == "[0] ");
  CHECK(rank_prefix(17) == "[17] ");
}
