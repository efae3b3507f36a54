// `ddl exec`: the per-task shim a scheduler's launcher (srun, mpirun, mpiexec) starts on each
// node. It maps the launcher's variables onto the worker environment contract, pins the task's
// GPU, and replaces itself with the user's program, so no extra process stays in between; with
// --relay (what `ddl run` gives it) it stays, to relay the program's output instead.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/task_identity.hpp"

namespace ddl::launcher {

struct ExecRequest {
  std::vector<std::string> command;         // the program and its arguments
  bool cpu_only = false;                    // --cpu: no GPU even when some are visible
  GpuOrder gpu_order = GpuOrder::AsListed;  // --gpu-order reverse: local rank 0 gets the last GPU (Polaris)
  // --relay: run the program as a child and pass its output on as relayed lines (relayed_output.hpp),
  // so that `ddl run` shows a line the program has not ended yet (a progress bar) while the task
  // launcher, which passes whole lines only, would hold it.
  bool relay_output = false;
  std::chrono::milliseconds grace_period{10'000};  // --grace-period: with --relay, SIGTERM to SIGKILL
  // --hang-timeout: with --relay, the program's libddl progress is relayed, and its stacks after
  // each such time without output or progress (for ddl run's hang watchdog).
  std::optional<std::chrono::milliseconds> hang_timeout;
  // --finish-signal: with --relay, ddl run's --requeue-signal. Once the task launcher passed it on,
  // the program ends as it may (it saves, or dies of it) and the task ends with 0: srun's
  // --kill-on-bad-exit would otherwise kill the other tasks while they save.
  std::optional<int> finish_signal;
};

// The contract environment of the task `id` over `env`. GPU workers are what ddl run planned
// (DDL_GPU_WORKERS), else whether `gpus` has any; a GPU worker on a node without GPUs is an error.
Environment task_environment(const Environment& env, const TaskIdentity& id, const ExecRequest& request, const GpuInventory& gpus);

// Resolves the program, builds its environment and execve()s it; throws UsageError for bad input,
// Error with exit status 127 for a program that cannot run. With relay_output it runs the program
// under a Supervisor instead and ends as the program ended: it returns the program's exit code,
// or dies of the signal that killed it; except after a stop signal or the finish signal, when it
// returns 0 and, where the program did not exit with 0, relays how it ended (relayed_end), so that
// the task launcher (srun's --kill-on-bad-exit, mpirun's abort) does not kill the other tasks while
// they save.
int exec_task(const ExecRequest& request, const Environment& env);

}  // namespace ddl::launcher
