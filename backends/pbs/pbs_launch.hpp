// Inside a PBS job: its nodes, and the mpiexec/mpirun line that starts one task per worker —
// Cray PALS mpiexec (Polaris) or OpenMPI mpirun with the job's node file (Sockeye-style sites).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/launch_layout.hpp"

namespace ddl::backends::pbs {

// The distinct hosts of $PBS_NODEFILE in their order (PBS writes a host once per chunk or slot).
// Throws ddl::Error naming the file when it cannot be read or is empty.
std::vector<std::string> nodefile_hosts(const std::string& path);

enum class MpiLauncher { Pals, OpenMpi };

// Which `mpiexec` this site has: Cray PALS says so in `mpiexec --version`; otherwise OpenMPI.
MpiLauncher detect_mpi_launcher();

// mpiexec -n N --ppn T --depth C --cpu-bind depth --label --envlist NAMES TASK...
std::vector<std::string> pals_command(const TaskLayout& layout);

// mpirun -np N --hostfile F --map-by ppr:T:node:PE=... --bind-to none --tag-output -x NAME... TASK...
// `as_root` adds --allow-run-as-root (OpenMPI refuses root without it).
std::vector<std::string> openmpi_command(const TaskLayout& layout, const std::string& nodefile, bool as_root);

// Reads mpirun --tag-output. mpirun tags each chunk a task writes, not each line, so one line of
// its output may hold pieces of several tasks' lines: "[1,0]<stdout>:a[1,1]<stdout>:b" then
// "[1,0]<stdout>:" completes rank 0's line "a". Pieces are kept per task and stream until done.
//
// A tag inside a line may also be a task's own text ("[1,1]<stdout>:" printed by rank 0). Where the
// tasks' text has a known form (ddl exec --relay's labelled lines), `starts_task_text(rank, text)`
// says whether `text` can begin a piece of that task: a tag inside a line counts only when it does,
// or when that task has a piece waiting for its end; otherwise the tag is text of the piece it is in.
class OpenMpiOutput {
 public:
  using TextCheck = std::function<bool(int rank, std::string_view text)>;
  explicit OpenMpiOutput(TextCheck starts_task_text = nullptr) : starts_task_text_(std::move(starts_task_text)) {}

  // The task lines `line` completes (maybe none), or nullopt for a line of mpirun's own.
  std::optional<std::vector<TaskLine>> feed(std::string_view line);

 private:
  TextCheck starts_task_text_;
  std::map<std::pair<int, bool>, std::string> unfinished_;  // (rank, is stderr) -> text so far
};

}  // namespace ddl::backends::pbs
