// Running a scheduler's command-line tools (scontrol, sbatch, squeue, qsub...) and reading what
// they print. Backends never print; they return what the tool said.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddl::backends {

struct CommandResult {
  int exit_code = -1;      // -1 when the command could not be started or timed out
  bool timed_out = false;  // killed after the timeout: what it did meanwhile (a job queued?) is unknown
  std::string out;
  std::string err;
  bool ok() const { return exit_code == 0; }
};

// Runs `argv` (argv[0] looked up on PATH) with stdin from /dev/null, and waits at most `timeout`
// for it (then kills it). `input`, when not empty, is written to its stdin instead.
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = std::chrono::seconds(30),
                          const std::string& input = {});

// The first line of a tool's output, without trailing blanks or CR; the last non-empty line.
std::string first_line(const std::string& text);
std::string last_line(const std::string& text);

// Whether `program` is on PATH.
bool on_path(const std::string& program);

}  // namespace ddl::backends
