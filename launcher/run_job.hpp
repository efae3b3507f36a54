// `ddl run` on this node: plan the world, host the rendezvous store, reserve MASTER_PORT, start one
// worker per slot with the contract environment, and supervise them to the end.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/host_list.hpp"
#include "launcher/preflight.hpp"
#include "launcher/requeue.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/world_plan.hpp"

namespace ddl::launcher {

// Who starts the workers: ddl itself on this node, or the allocation's task launcher.
enum class TaskLauncher { Auto, Local, Srun, OpenMpi, Pals };

struct RunRequest {
  LaunchRequest launch;
  TaskLauncher launcher = TaskLauncher::Auto;
  GpuOrder gpu_order = GpuOrder::AsListed;
  std::optional<int> cpus_per_task;  // cores per worker; default: the node's cores shared out
  std::string srun_mpi = "auto";     // srun --mpi: auto (pmix when Slurm offers it), none, or a plugin
  std::vector<std::string> command;  // program and its arguments
  SupervisorOptions supervision;
  std::vector<HostSlots> hosts;                  // -H / --hostfile: run on these hosts over the remote shell
  std::string remote_shell;                      // --rsh: the remote shell command; empty for the default
  std::string exclude;                           // --exclude: hosts to leave out of -H's or the allocation's (host_exclusion.hpp)
  PreflightMode preflight = PreflightMode::Off;  // --preflight: probe every worker's place first (preflight.hpp)
  int max_restarts = 0;                          // --max-restarts: start the workers again after a failure, this many times
  std::optional<RequeuePolicy> requeue;          // --requeue-signal: requeue the Slurm job when its signal ends the run
  std::optional<int> straggler_report_every;     // --report-stragglers: seconds between reports (0: at the end only)
  std::string torch_backend;                     // --torch-backend: the torch.distributed backend every group runs on (empty: the script's)
  int restart_count = 0;                         // which start this is (0: the first); run_job sets it
  std::string run_tag;                           // random, the same for every restart: part of DDL_RUN_ID; run_job sets it
};

// Runs the job and returns how it ended. After a worker failure, with restarts left, every worker
// is stopped and the whole group started again (torchrun's --max-restarts), with a fresh store,
// token and MASTER_PORT and TORCHELASTIC_RESTART_COUNT one higher; the last failure's code is
// the run's. Inside a Slurm or PBS allocation the workers are started
// on its nodes by srun / mpiexec / mpirun, each through `ddl exec`; elsewhere ddl starts them here. Bad requests throw ddl::UsageError
// (exit 2); a program that cannot be run throws ddl::Error with exit status 127, before any worker starts. `log` receives the launcher's
// own messages (the store's warnings). With `requeue`, the signal it names is the workers' cue to
// save and end (no restart follows it), and the job is then requeued (requeue.hpp). Every worker
// gets DDL_REQUEUE_COUNT, and a requeued job's --output-dir files continue.
RunOutcome run_job(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log);

}  // namespace ddl::launcher
