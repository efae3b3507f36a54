#include <doctest/doctest.h>

#include "common/rank_ranges.hpp"
#include "launcher/stacks.hpp"

using namespace ddl::launcher;

namespace {

std::string python_dump(const std::string& thread, const std::string& innermost) {
  return "Thread " + thread +
         " (most recent call first):\n  File \"/usr/lib/python3/threading.py\", line 327 in wait\n\n"
         "Current thread " +
         thread + "7 (most recent call first):\n" + innermost + "  File \"/home/u/train.py\", line 50 in <module>\n";
}

}  // namespace

TEST_CASE("rank ranges are written as runs") {
  CHECK(ddl::rank_ranges({0, 1, 2, 3, 4, 5, 6, 8, 9, 10}, ", ") == "0-6, 8-10");
  CHECK(ddl::rank_ranges({3}) == "3");
  CHECK(ddl::rank_ranges({1, 3, 4}) == "1,3-4");
  CHECK(ddl::rank_ranges({}).empty());
}

TEST_CASE("ranks in the same place are one group, whatever their thread ids; the largest group comes first") {
  const std::string in_allreduce = "  File \"/home/u/train.py\", line 40 in step\n";
  const std::string in_loader = "  File \"/usr/lib/python3/torch/utils/data/dataloader.py\", line 630 in __next__\n";
  std::map<int, RankStacks> stacks;
  for (int rank : {0, 1, 2, 4}) stacks[rank].text = python_dump("0x00007f00000" + std::to_string(rank), in_allreduce);
  stacks[3].text = python_dump("0x00007fabcdef", in_loader);
  stacks[5].none_because = "not a Python program started by ddl run";
  const std::string report = stacks_report(stacks);
  CHECK(
      report.starts_with("ddl: ranks 0-2, 4: in step (train.py:40)\n"
                         "    Thread (most recent call first):\n"
                         "      File \"/usr/lib/python3/threading.py\", line 327 in wait\n"
                         "    Thread (most recent call first):\n"
                         "      File \"/home/u/train.py\", line 40 in step\n"));
  CHECK(report.find("ddl: rank 3: in __next__ (dataloader.py:630)\n") != std::string::npos);
  CHECK(report.find("ddl: rank 5: no stack: not a Python program started by ddl run\n") != std::string::npos);
  CHECK(report.find("0x") == std::string::npos);
}

TEST_CASE("gdb's backtraces are grouped by their frames, without addresses, arguments or thread ids") {
  auto gdb = [](int lwp, const std::string& arg) {
    return "[Thread debugging using libthread_db enabled]\n"
           "0x00007f1 in __GI___clock_nanosleep (clock_id=0) at ../sysdeps/nanosleep.c:78\n"
           "\nThread 1 (Thread 0x7f2 (LWP " +
           std::to_string(lwp) +
           ") \"worker\"):\n"
           "#0  0x00007f1 in __GI___clock_nanosleep (clock_id=" +
           arg +
           ", flags=0) at ../sysdeps/nanosleep.c:78\n"
           "#1  0x0000561 in wait_for_peer (peer=" +
           arg +
           ") at worker.cpp:12\n"
           "#2  0x0000562 in main () at worker.cpp:30\n"
           "[Inferior 1 (process " +
           std::to_string(lwp) + ") detached]\n";
  };
  std::map<int, RankStacks> stacks;
  stacks[0].text = gdb(100, "1");
  stacks[1].text = gdb(200, "7");
  const std::string report = stacks_report(stacks);
  CHECK(report ==
        "ddl: ranks 0-1: in __GI___clock_nanosleep (nanosleep.c:78)\n"
        "    Thread \"worker\":\n"
        "      #0 __GI___clock_nanosleep at ../sysdeps/nanosleep.c:78\n"
        "      #1 wait_for_peer at worker.cpp:12\n"
        "      #2 main at worker.cpp:30\n");
}
