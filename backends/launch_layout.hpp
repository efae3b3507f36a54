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
};

// A task launcher's output line split into the task's rank and its text.
struct TaskLine {
  int rank = 0;
  std::string text;
  bool unfinished = false;  // text of a line that goes on later (relayed by ddl's host agent), not a whole line
  bool redrawn = false;     // a line that ended with '\r' (relayed as a whole line), to be drawn over
  bool names_host = false;  // not output: `text` is the host the rank runs on (relayed once per stream)
};

// "3: text" (srun --label, PALS mpiexec --label; the rank may be padded with blanks).
std::optional<TaskLine> rank_colon_label(std::string_view line);

}  // namespace ddl::backends
