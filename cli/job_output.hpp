// How `ddl submit --wait`, `ddl status` and `ddl jupyter` show a batch job: one line per state,
// rewritten in place on a terminal, and the tail of its output file.
#pragma once

#include <cstddef>
#include <string>

namespace ddl::backends {
struct JobState;
}

namespace ddl::cli {

// "job 123 RUNNING on nid001 (reason), exit code 3".
std::string describe(const backends::JobState& s);
// One live status line for a followed job (rewritten in place on a terminal).
void print_job_status(const backends::JobState& s);
// The last `lines` lines of a job's output file (or a line saying there is none).
void print_tail(const std::string& path, std::size_t lines);

}  // namespace ddl::cli
