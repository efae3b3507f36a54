// Runs the workers of one node and watches them: their output goes out through an OutputRouter
// (output_router.hpp: line by line, prefixed with the rank), SIGINT/SIGTERM/SIGHUP are forwarded to
// them, and on the first worker that fails all the others are stopped (SIGTERM, then SIGKILL after
// the grace period). When it returns, no worker and nothing a worker started is left running.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/launch_layout.hpp"
#include "common/environment.hpp"
#include "launcher/rank_selection.hpp"

namespace ddl::launcher {

// Opens /dev/null onto whichever of descriptors 0-2 ddl was started without (`ddl run ... >&-`):
// the next descriptor ddl opens (a socket, the signalfd) would take that number, and output meant
// for stdout would be written into it. Call first thing.
void hold_standard_descriptors();

// A signal that asks the workers to save their work and end (Slurm's signal before the time limit,
// `ddl run --requeue-signal`). It is passed on to the workers; from then on a worker that ends,
// however it ends, stops no other, and those still running at `deadline(the signal's arrival)` are
// stopped as after a failure (SIGTERM, SIGKILL after the grace period), with a line that says so.
// A second one changes nothing; a signal that stops a run still stops it. One that comes while
// the run is stopping, or after the workers ended, is only noted (RunOutcome::finished_on).
struct FinishRequest {
  int signal = SIGUSR1;
  std::function<std::chrono::steady_clock::time_point(std::chrono::steady_clock::time_point)> deadline;
};

struct SupervisorOptions {
  std::chrono::milliseconds grace_period{10'000};  // between SIGTERM and SIGKILL
  bool prefix_output = true;                       // "[rank] " before each line
  bool prefix_with_host = false;                   // --prefix host: "[host:rank] " instead
  std::string output_dir;                          // also write rank.N.out / rank.N.err here when set
  // --ranks: only these ranks' lines reach ddl's own output (every rank's still go to output_dir,
  // and a failed rank's last lines to the failure summary); unset: every rank's.
  std::optional<RankSelection> shown_ranks;
  std::string host;  // this node's name, for the failure summary
  // On a host of `ddl run -H`, the agent's stdin from the launching host: a line "signal N" acts as
  // signal N arriving, and its end (the connection dropped) as SIGHUP. -1: none.
  int control_fd = -1;
  // Output goes out as lines labelled with the rank (relayed_output.hpp) for the launching host
  // to label (prefix_output and output_dir are then the launching host's business).
  bool relay_with_rank_labels = false;
  // Under srun (ddl exec --relay): the launcher's daemon, this process's parent, delivers each
  // signal to every process of the task, the worker too, and kills what is left itself. A signal
  // from it is not passed on again (the worker would get it twice) and starts no SIGKILL of ddl's
  // own; workers stay in this process's session, where a launcher that signals the task's process
  // group reaches them.
  bool parent_signals_workers = false;
  // --hang-timeout: when no worker has written output or completed a libddl op for this long, every
  // rank's stacks are shown (grouped by identical stack; also in output_dir/stacks.txt) and the run
  // stops with kHangExitCode, or goes on when hang_report_only (--hang-action report), reporting
  // again after each further timeout of quiet. A relaying supervisor (relay_with_rank_labels)
  // relays its ranks' progress instead, and their stacks after each timeout of its own workers'
  // quiet, for the launching host to report.
  std::optional<std::chrono::milliseconds> hang_timeout;
  bool hang_report_only = false;
  // --requeue-signal: the signal that asks the workers to save and end before the job's time limit.
  std::optional<FinishRequest> finish_on;
  // The output_dir files continue what is there (a requeued job's next start) instead of starting empty.
  bool append_output = false;
  // A failed worker stops the others (fail-fast). Off, each runs to its own end and the first
  // failure is still the outcome's: preflight's probes of each host, whose verdicts are all wanted.
  bool stop_on_failure = true;
};

// Reads one line of a task launcher's output (srun --label, mpirun --tag-output): nullopt for a
// line of the launcher's own, else the task lines it completes, each with the task's rank (none
// when it only continues a task's unfinished line).
using LineLabeller = std::function<std::optional<std::vector<backends::TaskLine>>(std::string_view line)>;

struct WorkerLaunch {
  int rank = 0;
  std::string program;  // resolved path
  std::vector<std::string> argv;
  Environment env;
  // Set when this process is a task launcher that runs every rank (srun, mpirun) and labels each
  // line with the task's rank: lines are then prefixed, filed and kept by that rank instead.
  LineLabeller labeller;
  // The signal that tells it to stop its tasks, when SIGINT does not (srun wants two SIGINTs).
  int interrupt_signal = 0;
  // For a task launcher that kills its tasks at once when told to stop them (srun answers SIGTERM
  // with SIGKILL): sends a signal to its tasks instead, through the scheduler, given the launcher's
  // pid; false when it could not (the launcher then gets interrupt_signal). A SIGKILL sent this way
  // is followed by the launcher's own a few seconds later, if it has not ended by then.
  std::function<bool(pid_t, int)> signal_tasks;
  // Set for a remote shell running a host's agent: its stdin is a pipe that gets this text first
  // and then the signals meant for its workers, as lines "signal N". SIGKILL is also sent as a
  // line, and the remote shell itself is killed a few seconds later if it has not ended by then.
  std::optional<std::string> control_input;
  // What to call this launch in the failure summary when it is not a worker (a host's name).
  std::string host;
  // A host's agent or a task launcher: the ranks it runs, whose stacks it relays.
  std::vector<int> relayed_ranks;
};

struct WorkerFailure {
  std::string description;               // set when no rank failed but the launch did: the whole error, one line
  int rank = 0;                          // -1 when a task launcher ran the workers and did not say which one failed
  std::string host;                      // where it ran; with rank -1, the task launcher's name
  int exit_code = 0;                     // the worker's exit status, or 128 + signal
  int signal = 0;                        // the signal that killed it, 0 when it exited
  std::vector<std::string> stderr_tail;  // its last lines of stderr
  // A task launcher's or host agent's ranks that never started, though it exited with 0.
  std::vector<int> never_started;
  // The rank's own relay (ddl exec --relay) said how its program ended, its task having ended with 0.
  bool told_by_relay = false;
  // The failure a rank's relay told, which the task launcher's own failure then replaced: it stands
  // where the launcher's report names no rank.
  std::shared_ptr<const WorkerFailure> relayed;
};

struct RunOutcome {
  int exit_code = 0;                     // what `ddl run` exits with
  std::map<int, int> wait_status;        // each worker's status as waitpid() gave it, by rank
  std::optional<WorkerFailure> failure;  // the first worker that failed, if any
  int interrupted_by = 0;                // the signal that stopped the run from outside, if any
  // The first signal from outside that stopped the run or came while it stopped, a failure's
  // stop too (Ctrl-C while the workers of a failed attempt are stopped): the run is not restarted.
  int signalled = 0;
  int workers_stopped = 0;  // workers ddl stopped because of a failure or signal
  // A signal ended the wait for a reader of ddl's output that had stopped reading: what it had not
  // taken was dropped, and ddl's own last words must not wait for it either.
  bool output_given_up = false;
  // ddl's stdout or stderr reader went away (`| head`): the workers got SIGPIPE, and a restart would
  // only do so again.
  bool reader_gone = false;
  // --hang-timeout stopped the run: nothing had moved for this long.
  std::optional<std::chrono::milliseconds> hung_after;
  // The finish signal (SupervisorOptions::finish_on) came and no signal stopped the run; the exit
  // code is then run_job's to decide (requeued or not), a failure's before it aside.
  int finished_on = 0;
  bool workers_overran = false;  // workers still running when their time to finish was over were stopped
  bool requeued = false;         // run_job put the batch job back in the queue after the finish signal
};

// The outcome of a run that signal `sig` stopped before any worker started (see
// Supervisor::signal_before_run).
RunOutcome stopped_before_start(int sig);

class Supervisor {
 public:
  // Blocks the signals it handles in the calling thread, so that threads started afterwards (the
  // store) never receive them; construct it before starting any thread.
  explicit Supervisor(SupervisorOptions options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  RunOutcome run(const std::vector<WorkerLaunch>& workers);
  // A signal that would stop a run (SIGINT, SIGTERM, ...) and came before run(), or 0; those that
  // only ask workers for something (SIGUSR1/2) are dropped, as there are none yet. For work between
  // the Supervisor's making and its run that may take long (looking up a thousand host names):
  // the signals are blocked meanwhile, and without this Ctrl-C waited for all of it.
  int signal_before_run();

 private:
  SupervisorOptions options_;
  int early_finish_ = 0;  // the finish signal, when signal_before_run() found it
  sigset_t original_mask_{};
  sigset_t worker_mask_{};  // the mask workers start with
  int signal_fd_ = -1;
};

// A worker's unfinished line (no '\n' or '\r' yet: a prompt, "Loading...", a progress bar's current
// state) is shown once its stream has been quiet this long, as a terminal would show it; what
// comes later continues it (TerminalLines keeps the lines of different workers apart).
inline constexpr std::chrono::milliseconds kUnfinishedLineQuietTime{100};

// What `ddl run` exits with when --hang-timeout stopped it (as timeout(1) does when time ran out).
inline constexpr int kHangExitCode = 124;

// How long a supervisor waits for its Python workers' dumps (written at once, unless a process is
// stopped or in the kernel), and for gdb on the others.
inline constexpr std::chrono::seconds kPythonDumpWait{2};
inline constexpr std::chrono::seconds kNativeStackWait{10};
// How long a launching host waits for stacks that hosts' agents or tasks relay: their own wait,
// and time for the relay.
inline constexpr std::chrono::seconds kRelayedStacksWait{kPythonDumpWait + kNativeStackWait + std::chrono::seconds(8)};

// Lines of stderr kept per worker for the failure summary.
inline constexpr size_t kStderrTailLines = 10;
// A task launcher's stderr carries every rank's lines: more are kept to find the failed rank's.
inline constexpr size_t kLauncherStderrTailLines = 400;

}  // namespace ddl::launcher
