// How output is relayed to `ddl run` from a host's agent (`ddl run -H`) and from `ddl exec --relay`
// under a task launcher (srun, mpirun, mpiexec): every piece goes as a line of its own, ending in
// '\n' (launchers pass and label whole lines only), labelled with the worker's rank:
//   "rank: text\n"  a line that ended with '\n';
//   "rank~ text\n"  a line redrawn in place (it ended with '\r': a progress bar's update);
//   "rank+ text\n"  the text of an unfinished line passed before its end
//                   (LineSplitter::pass_unfinished), which later pieces continue;
//   "rank@ host\n"  not output: the host the rank runs on, first on each stream (--prefix host);
//   "rank* \n"      not output: the rank's libddl completed ops (the hang watchdog's sign of life);
//   "rank# text\n"  not output: a line of the rank's stacks, asked for by the hang watchdog;
//   "rank! why\n"   not output: the rank's stacks are complete (`why` says why there are none);
//   "rank= N\n"     not output: the rank's program ended with wait status N although its task ends
//                   with 0 (ddl exec after a stop or finish signal: see exec_task.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/launch_layout.hpp"

namespace ddl::launcher {

// The most text one relayed line carries: a longer line goes in several pieces ("rank+ "). srun
// --label cuts a task's output into messages of at most 1024 bytes and labels each as a line of its
// own, so a longer relayed line would arrive cut, with line ends added; "rank+ " (at most 11 bytes)
// + this + "\n" stays within one message.
constexpr size_t kLongestRelayedText = 1000;

// The relayed form of `text` of `rank` with `end` ('\n', '\r' or LineSplitter::kNoEnd).
std::string relayed_piece(int rank, std::string_view text, char end);

// The relayed line that names the host `rank` runs on.
std::string relayed_host(int rank, std::string_view host);

// The relayed line that says `rank`'s libddl completed ops.
std::string relayed_progress(int rank);

// The relayed lines of `rank`'s stacks (each line cut at kLongestRelayedText), ended by the line
// that says they are complete; `none_because` says why `stacks` is empty, if it is.
std::string relayed_stacks(int rank, std::string_view stacks, std::string_view none_because);

// The relayed line that says `rank`'s program ended with `wait_status` (as waitpid() gave it).
std::string relayed_end(int rank, int wait_status);

// The task line a relayed line carries (without its '\n'); nullopt for a line of any other form.
std::optional<backends::TaskLine> relayed_line(std::string_view line);

// Whether `text` (what follows a task launcher's label) begins a line that ddl exec --relay relayed
// for `rank` ("rank: ...", after one blank where OpenMPI 5 puts it).
bool starts_relayed_line(int rank, std::string_view text);

// A task launcher's line of `ddl exec --relay`'s output: the relayed line inside it when it is one
// of the same rank, else `task` as it is (a line of ddl exec's own).
backends::TaskLine unwrapped(backends::TaskLine task);

// The last `most` whole lines of `rank` among `tasks`, for a failure summary: the pieces of an
// unfinished line joined, a line redrawn in place left out (as a progress bar's updates are).
std::vector<std::string> whole_lines_of(int rank, const std::vector<backends::TaskLine>& tasks, size_t most);

}  // namespace ddl::launcher
