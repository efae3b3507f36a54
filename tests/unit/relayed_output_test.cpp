#include <doctest/doctest.h>

#include "backends/launch_layout.hpp"
#include "launcher/line_splitter.hpp"
#include "launcher/relayed_output.hpp"

using namespace ddl::launcher;
using ddl::backends::TaskLine;

TEST_CASE("relayed output: every piece a line of its own, ending in a newline, marked by how its line ended") {
  CHECK(relayed_piece(3, "epoch 1", '\n') == "3: epoch 1\n");
  CHECK(relayed_piece(3, " 50%", '\r') == "3~  50%\n");
  CHECK(relayed_piece(12, "Loading...", LineSplitter::kNoEnd) == "12+ Loading...\n");
}

TEST_CASE("the launching side reads each form back, and no other line as relayed") {
  auto unfinished = relayed_line("12+ Loading...");
  REQUIRE(unfinished);
  CHECK((unfinished->rank == 12 && unfinished->text == "Loading..." && unfinished->unfinished && !unfinished->redrawn));
  auto redrawn = relayed_line("3~  50%");
  REQUIRE(redrawn);
  CHECK((redrawn->rank == 3 && redrawn->text == " 50%" && redrawn->redrawn && !redrawn->unfinished));
  auto whole = relayed_line("3: epoch 1: done");
  REQUIRE(whole);
  CHECK((whole->text == "epoch 1: done" && !whole->unfinished && !whole->redrawn));
  CHECK(relayed_line("0+ ")->text.empty());
  CHECK(relayed_line("0: ")->text.empty());
  CHECK_FALSE(relayed_line("+ x"));
  CHECK_FALSE(relayed_line("3+x"));
  CHECK_FALSE(relayed_line("3:"));
  CHECK_FALSE(relayed_line(" 3: padded, as srun pads its labels"));
  CHECK_FALSE(relayed_line("3? x"));
  CHECK_FALSE(relayed_line("ssh: connect to host b port 22: Connection refused"));
}

TEST_CASE("a task launcher's label around ddl exec's relayed line is taken off only for the same rank") {
  CHECK(unwrapped({4, "4+ Loading"}).unfinished);
  CHECK(unwrapped({4, "4+ Loading"}).text == "Loading");
  CHECK(unwrapped({4, "4~ 10%"}).redrawn);
  CHECK(unwrapped({4, "4: 2: text"}).text == "2: text");
  CHECK(unwrapped({4, "ddl: error: no GPU"}).text == "ddl: error: no GPU");  // ddl exec's own line
  CHECK(unwrapped({4, " 4+ Loading"}).text == "Loading");                    // OpenMPI 5's tag ends in a blank
  CHECK(unwrapped({4, " plain"}).text == " plain");
  const TaskLine other = unwrapped({4, "5: text"});
  CHECK((other.rank == 4 && other.text == "5: text"));
}

TEST_CASE("a failure summary gets a rank's whole lines: unfinished pieces joined, redraws left out") {
  const std::vector<TaskLine> tasks{{1, "Loading", true},     {0, "other rank"}, {1, "... done"},      {1, " 10%", false, true},
                                    {1, " 20%", false, true}, {1, "Traceback"},  {1, "Error: x", true}};
  CHECK(whole_lines_of(1, tasks, 10) == std::vector<std::string>{"Loading... done", "Traceback", "Error: x"});
  CHECK(whole_lines_of(0, tasks, 10) == std::vector<std::string>{"other rank"});
  CHECK(whole_lines_of(1, tasks, 2) == std::vector<std::string>{"Traceback", "Error: x"});  // the last ones
}

TEST_CASE("a rank's host is relayed as a line of its own, read back as no output, under a launcher's label too") {
  CHECK(relayed_host(5, "nid001234") == "5@ nid001234\n");
  auto host = relayed_line("5@ nid001234");
  REQUIRE(host);
  CHECK((host->rank == 5 && host->text == "nid001234" && host->notice == TaskLine::Notice::kHost && !host->unfinished && !host->redrawn));
  CHECK(unwrapped({5, "5@ nid001234"}).notice == TaskLine::Notice::kHost);
  CHECK(unwrapped({4, "5@ nid001234"}).notice == TaskLine::Notice::kNone);  // another rank's: the launcher's line as it is
  CHECK(starts_relayed_line(5, " 5@ nid001234"));                           // after OpenMPI 5's blank
  const std::vector<TaskLine> tasks{{5, "nid001234", false, false, TaskLine::Notice::kHost}, {5, "Traceback"}};
  CHECK(whole_lines_of(5, tasks, 10) == std::vector<std::string>{"Traceback"});
}

TEST_CASE("the hang watchdog's notices are relayed as lines of their own and read back as no output") {
  CHECK(relayed_progress(3) == "3* \n");
  CHECK(relayed_line("3* ")->notice == TaskLine::Notice::kProgress);
  // Stacks: one line each, cut to what a launcher passes whole, then the end.
  const std::string stacks = "Thread 0x1 (most recent call first):\n  File \"t.py\", line 3 in f\n" + std::string(1500, 'x');
  const std::string relayed = relayed_stacks(3, stacks, "");
  CHECK(relayed.starts_with("3# Thread 0x1 (most recent call first):\n3#   File \"t.py\", line 3 in f\n3# xxx"));
  CHECK(relayed.ends_with("\n3! \n"));
  std::vector<TaskLine> read;
  size_t start = 0;
  for (size_t end = relayed.find('\n'); end != std::string::npos; start = end + 1, end = relayed.find('\n', start))
    read.push_back(*relayed_line(std::string_view(relayed).substr(start, end - start)));
  REQUIRE(read.size() == 4);
  CHECK((read[1].notice == TaskLine::Notice::kStack && read[1].text == "  File \"t.py\", line 3 in f"));
  CHECK(read[2].text.size() == kLongestRelayedText);
  CHECK((read[3].notice == TaskLine::Notice::kStacksEnd && read[3].text.empty()));
  CHECK(relayed_stacks(4, "", "not a Python process") == "4! not a Python process\n");
  CHECK(whole_lines_of(3, read, 10).empty());  // none of it is the rank's output
}

TEST_CASE("how a rank's program ended, its task ending with 0, is relayed as a notice") {
  CHECK(relayed_end(7, 15) == "7= 15\n");  // killed by SIGTERM: the wait status as waitpid() gives it
  const auto read = relayed_line("7= 15");
  REQUIRE(read);
  CHECK((read->rank == 7 && read->text == "15" && read->notice == TaskLine::Notice::kEnded));
  CHECK(unwrapped({7, "7= 256"}).notice == TaskLine::Notice::kEnded);
  CHECK(whole_lines_of(7, {*read}, 10).empty());  // not output
}
