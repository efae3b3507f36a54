#include <doctest/doctest.h>

#include "backends/launch_layout.hpp"
#include "launcher/line_splitter.hpp"
#include "launcher/relayed_output.hpp"

using namespace ddl::launcher;

TEST_CASE("a host's agent relays whole lines as \"rank: text\" with their end, unfinished text as a line of its own") {
  CHECK(relayed_piece(3, "epoch 1", '\n') == "3: epoch 1\n");
  CHECK(relayed_piece(3, " 50%", '\r') == "3:  50%\r");
  CHECK(relayed_piece(12, "Loading...", LineSplitter::kNoEnd) == "12+ Loading...\n");
}

TEST_CASE("the launching host reads unfinished text back, and no other line as such") {
  auto unfinished = relayed_unfinished_line("12+ Loading...");
  REQUIRE(unfinished);
  CHECK(unfinished->rank == 12);
  CHECK(unfinished->text == "Loading...");
  CHECK(unfinished->unfinished);
  CHECK(relayed_unfinished_line("0+ ")->text.empty());
  CHECK_FALSE(relayed_unfinished_line("3: epoch 1"));
  CHECK_FALSE(relayed_unfinished_line("+ x"));
  CHECK_FALSE(relayed_unfinished_line("3+x"));
  CHECK_FALSE(relayed_unfinished_line("ssh: connect to host b port 22: Connection refused"));
  auto whole = ddl::backends::rank_colon_label("3: epoch 1");
  REQUIRE(whole);
  CHECK_FALSE(whole->unfinished);
}
