// What every scheduler's launch command needs: how many tasks go where, and what each runs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddl::backends {

struct TaskLayout {
  int num_nodes = 1;
  int tasks_per_node = 1;
  int cpus_per_task = 1;
  std::vector<std::string> task_command;    // what each task runs: ddl exec ... -- program args
  std::vector<std::string> exported_names;  // variables of the launcher's environment every task needs
  std::vector<std::string> hosts;           // the nodes to run on, in order (num_nodes of them); empty: the launcher's first nodes
};

// A task launcher's output line split into the task's rank and its text.
struct TaskLine {
  int rank = 0;
  std::string text;
  bool unfinished = false;  // text of a line that goes on later (relayed by ddl's host agent), not a whole line
  bool redrawn = false;     // a line that ended with '\r' (relayed as a whole line), to be drawn over
  // Not output, but word from the rank's supervisor (relayed_output.hpp says how each is relayed).
  enum class Notice : char {
    kNone,       // output
    kHost,       // `text` is the host the rank runs on (relayed once per stream)
    kProgress,   // the rank's libddl completed ops (for the hang watchdog)
    kStack,      // `text` is a line of the rank's stacks
    kStacksEnd,  // the rank's stacks are complete; `text`, when not empty, says why there are none
    kEnded,      // `text` is the wait status the rank's program ended with, its task ending with 0
  };
  Notice notice = Notice::kNone;
};

// "3: text" (srun --label, PALS mpiexec --label; the rank may be padded with blanks).
std::optional<TaskLine> rank_colon_label(std::string_view line);

}  // namespace ddl::backends
