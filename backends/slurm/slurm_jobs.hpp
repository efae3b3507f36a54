// Reading a Slurm job's state without ambiguity. `scontrol show job -o` prints "Key=Value" fields
// separated by blanks, but a job name, output path or comment may hold blanks and "Key=" text of
// its own (-J "x JobState=COMPLETED"), so no reading of that line is safe. squeue instead prints
// fields chosen by us: those that no user sets (state, reason, nodes, ids) between '|', and a
// free-text one (the output pattern, the name) only alone, as the whole answer of its own query.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddl::backends::slurm {

// squeue -O fields of one job that no user can fill with free text.
struct JobFacts {
  std::string job_id;         // Slurm's own number for this record (an array task has its own)
  std::string state;          // PENDING, RUNNING, COMPLETED, ...
  std::string reason;         // "None" while nothing holds it
  std::string nodes;          // "" while pending
  std::string exit_code;      // the raw wait status (22.05) or "code:signal" (23.02 and later)
  std::string user;           // for %u
  std::string batch_host;     // for %N
  std::string array_job_id;   // the job's own number when it is not an array task
  std::string array_task_id;  // "N/A" when not an array task; "3-5" for tasks not yet started
};

// The squeue command (-O) that prints the facts of job `id`, one '|'-ended field each.
std::vector<std::string> facts_query(const std::string& id);

// The first record of facts_query's answer; nullopt when it has none or too few fields.
std::optional<JobFacts> read_facts(const std::string& squeue_output);

// The squeue command that prints one free-text field (STDOUT, Name) of exactly one job record:
// nullopt when `facts` stand for several (array tasks not yet started), whose files differ.
std::optional<std::vector<std::string>> one_field_query(const JobFacts& facts, const std::string& field);

// The field one_field_query asked for: squeue's whole answer less the line end it adds.
std::string read_one_field(const std::string& squeue_output);

// A job's exit status as a process's: the code, or 128 + the signal that ended it.
std::optional<int> exit_status(const std::string& exit_code);

// Whether an output pattern needs the job's name (%x) to be expanded.
bool pattern_names_job(const std::string& pattern);

// The file a batch job writes its output to, from its --output pattern as squeue prints it (an
// absolute path): expanded as slurmstepd does for the batch step (src/slurmd/common/fname.c, the
// file Slurm really writes, which `scontrol show job` does not always name): %% %A %a %J %j %N %n
// %s %t %u %x with an optional zero-padding width (at most 10); other % sequences stay as they
// are. A pattern with a backslash is not expanded: Slurm drops each lone backslash and keeps one
// of each pair.
std::string batch_output_file(const std::string& pattern, const JobFacts& facts, const std::string& job_name);

}  // namespace ddl::backends::slurm
