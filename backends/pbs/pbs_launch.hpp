// Inside a PBS job: its nodes, and the mpiexec/mpirun line that starts one task per worker —
// Cray PALS mpiexec (Polaris) or OpenMPI mpirun with the job's node file (Sockeye-style sites).
#pragma once

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
class OpenMpiOutput {
 public:
  // The task lines `line` completes (maybe none), or nullopt for a line of mpirun's own.
  std::optional<std::vector<TaskLine>> feed(std::string_view line);

 private:
  std::map<std::pair<int, bool>, std::string> unfinished_;  // (rank, is stderr) -> text so far
};

}  // namespace ddl::backends::pbs
