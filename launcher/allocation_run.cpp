#include "launcher/allocation_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <deque>
#include <memory>
#include <regex>

#include <fmt/format.h>

#include "backends/command.hpp"
#include "backends/pbs/pbs_launch.hpp"
#include "backends/slurm/slurm_launch.hpp"
#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/worker_contract.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/host.hpp"
#include "launcher/host_exclusion.hpp"
#include "launcher/nccl_network.hpp"
#include "launcher/program_separators.hpp"
#include "launcher/relayed_output.hpp"
#include "launcher/remote_job.hpp"
#include "launcher/run_services.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

// NCPUS, the cores PBS gave each node (this one's, taken for every node); this machine's cores when
// unset or 0 (a chunk asked for ncpus=0). Anything but a count is an error naming it: atoi would
// wrap 99999999999 around and give every worker hundreds of millions of OpenMP threads.
int pbs_cpus_per_node(const Environment& env) {
  constexpr long long kMostCpus = 1 << 20;
  const auto ncpus = lookup(env, "NCPUS");
  if (!ncpus || ncpus->empty()) return available_cpus();
  const auto count = whole_number(*ncpus, kMostCpus);
  if (!count)
    throw Error(fmt::format("NCPUS='{}' is not a count of cores PBS sets (0 to {})", *ncpus, kMostCpus),
                "unset NCPUS if you set it yourself: inside a PBS job PBS sets it");
  return *count > 0 ? static_cast<int>(*count) : available_cpus();
}

using backends::Scheduler;

// What the allocation holds, per node.
struct AllocationShape {
  std::vector<std::string> hosts;
  int gpus_per_node = 0;
  int cpus_per_node = 1;
  std::vector<int> tasks_per_node;  // what the allocation asked srun to start on each node, if known
  bool hosts_excluded = false;      // --exclude left some of the allocation's nodes out of `hosts`
};

// The allocation's nodes less those --exclude names (Slurm's node ranges expanded by Slurm).
void leave_out_excluded(AllocationShape& shape, const backends::Allocation& allocation, const RunRequest& request,
                        const std::function<void(const std::string&)>& log) {
  if (request.exclude.empty()) return;
  const bool slurm = allocation.scheduler == Scheduler::Slurm;
  const HostExclusion exclusion(request.exclude, slurm ? HostExclusion::RangeExpander(backends::slurm::expand_hostlist) : nullptr);
  const auto left = exclusion.hosts_left(
      shape.hosts, fmt::format("{} job {}'s nodes", backends::scheduler_name(allocation.scheduler), allocation.job_id), log);
  std::vector<int> tasks_left;
  for (size_t i = 0; i < shape.hosts.size() && i < shape.tasks_per_node.size(); ++i)
    if (!exclusion.covers(shape.hosts[i])) tasks_left.push_back(shape.tasks_per_node[i]);
  shape.hosts_excluded = left.size() < shape.hosts.size();
  shape.hosts = left;
  shape.tasks_per_node = tasks_left;
}

AllocationShape shape_of(const backends::Allocation& allocation, const Environment& env) {
  AllocationShape shape;
  if (allocation.scheduler == Scheduler::Slurm) {
    auto nodelist = lookup(env, "SLURM_JOB_NODELIST");
    if (!nodelist) nodelist = lookup(env, "SLURM_NODELIST");
    if (!nodelist)
      throw Error("inside Slurm job " + allocation.job_id + " but SLURM_JOB_NODELIST is not set", "run ddl inside salloc or sbatch");
    if (nodelist->find_first_not_of(" \t") == std::string::npos)
      throw Error("inside Slurm job " + allocation.job_id + " but SLURM_JOB_NODELIST is empty", "run ddl inside salloc or sbatch");
    shape.hosts = backends::slurm::expand_hostlist(*nodelist);
    shape.gpus_per_node = backends::slurm::gpus_per_node(env);
    shape.cpus_per_node = backends::slurm::cpus_per_node(env);
    shape.tasks_per_node = backends::slurm::tasks_per_node(env, static_cast<int>(shape.hosts.size()));
  } else {
    const auto nodefile = lookup(env, "PBS_NODEFILE");
    if (!nodefile || nodefile->empty())
      throw Error("inside PBS job " + allocation.job_id + " but PBS_NODEFILE is not set", "run ddl inside qsub's job (or qsub -I)");
    shape.hosts = backends::pbs::nodefile_hosts(*nodefile);
    shape.gpus_per_node = discover_gpus(env).count();  // this node's, taken for every node
    shape.cpus_per_node = pbs_cpus_per_node(env);
  }
  return shape;
}

// CPU workers with no count: as many per node as srun would start (salloc --ntasks-per-node),
// so `ddl run --cpu` and `srun` agree; one per node when the allocation does not say.
std::optional<int> allocation_tasks_per_node(const backends::Allocation& allocation, const AllocationShape& shape, int nodes) {
  if (shape.tasks_per_node.empty()) return std::nullopt;
  const auto used_end = shape.tasks_per_node.begin() + std::min<long>(nodes, static_cast<long>(shape.tasks_per_node.size()));
  const auto [fewest, most] = std::minmax_element(shape.tasks_per_node.begin(), used_end);
  if (*fewest != *most)
    throw UsageError(fmt::format("{} job {} starts {} to {} tasks on its nodes, and ddl runs the same number on every node",
                                 backends::scheduler_name(allocation.scheduler), allocation.job_id, *fewest, *most),
                     fmt::format("give the count: --nproc-per-node {} (or ask for --ntasks-per-node)", *fewest));
  return *fewest;
}

WorldPlan plan_in_allocation(const RunRequest& request, const backends::Allocation& allocation, const AllocationShape& shape) {
  LaunchRequest launch = request.launch;
  const int nodes = static_cast<int>(shape.hosts.size());
  const char* scheduler = backends::scheduler_name(allocation.scheduler);
  if (launch.num_nodes && *launch.num_nodes > nodes)
    throw UsageError(fmt::format("-N {} but {} job {} holds {} node(s){}", *launch.num_nodes, scheduler, allocation.job_id, nodes,
                                 shape.hosts_excluded ? " besides those --exclude leaves out" : ""),
                     fmt::format("use -N {} or fewer, or ask the scheduler for more nodes", nodes));
  if (launch.gpus_per_node && *launch.gpus_per_node > shape.gpus_per_node && !launch.share_gpus)
    throw UsageError(fmt::format("--gpus-per-node {} but {} job {} gives {} GPU(s) per node", *launch.gpus_per_node, scheduler,
                                 allocation.job_id, shape.gpus_per_node),
                     fmt::format("use --gpus-per-node {} or fewer, or ask the scheduler for more GPUs per node", shape.gpus_per_node));
  if (!launch.num_nodes) {
    launch.num_nodes =
        launch.total_workers && !launch.workers_per_node && !launch.gpus_per_node ? std::min(nodes, *launch.total_workers) : nodes;
    launch.nodes_from = fmt::format("{} job {}", scheduler, allocation.job_id);
  }
  if (!launch.total_workers && !launch.workers_per_node && !launch.gpus_per_node && (launch.cpu_only || shape.gpus_per_node == 0))
    launch.workers_per_node = allocation_tasks_per_node(allocation, shape, *launch.num_nodes);
  return plan_world(launch, shape.gpus_per_node);
}

TaskLauncher choose_launcher(const RunRequest& request, Scheduler scheduler) {
  if (request.launcher != TaskLauncher::Auto) return request.launcher;
  if (scheduler == Scheduler::Slurm) return TaskLauncher::Srun;
  return backends::pbs::detect_mpi_launcher() == backends::pbs::MpiLauncher::Pals ? TaskLauncher::Pals : TaskLauncher::OpenMpi;
}

// mpirun's "Process name: [[job,vpid],rank]" lines are short; longer ones are not searched.
constexpr size_t kLongestSearchedLine = 4096;

// The run-wide values every task needs; the launcher passes them on (`-x` for mpirun).
const char* const kExportedToTasks[] = {contract::kStoreAddr,
                                        contract::kStoreToken,
                                        contract::kRunId,
                                        contract::kSize,
                                        contract::kLocalSize,
                                        contract::kNumNodes,
                                        "DDL_GPU_WORKERS",
                                        "DDL_SHARE_GPUS",
                                        "DDL_CPUS_PER_TASK",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "PATH",
                                        "TORCHELASTIC_RESTART_COUNT",
                                        "TORCHELASTIC_MAX_RESTARTS"};
// Passed on where the launcher's environment has them: --torch-backend sets both.
const char* const kExportedWhenSet[] = {"LD_LIBRARY_PATH", "PYTHONPATH", "DDL_TORCH_BACKEND", contract::kArrayIndex};

// mpirun starts the tasks of other nodes (over ssh) in an environment of their own, not ddl run's:
// it passes on the variables it is told to (-x NAME). So every variable of ddl run's environment
// goes by name, less what belongs to this host and session (forwarded_environment), mpirun's own
// (OMPI_*, PMIX_*: per task) and names that are not identifiers (mpirun's -x would misread them).
std::vector<std::string> user_variables_for_other_nodes(const Environment& env) {
  std::vector<std::string> names;
  for (const auto& [name, value] : forwarded_environment(env))
    if (!name.starts_with("OMPI_") && !name.starts_with("PMIX_") && !name.starts_with("PRTE_") && is_variable_name(name))
      names.push_back(name);
  return names;
}

// Cores per worker: what the user asked for, else the node's cores shared out.
int cpus_per_task(const RunRequest& request, const WorldPlan& plan, const AllocationShape& shape) {
  return request.cpus_per_task.value_or(std::max(1, shape.cpus_per_node / plan.workers_per_node));
}

// The --mpi plugin srun gets: PMIx when asked for "auto" and Slurm offers it (MPI programs and
// libddl can then bootstrap through it); nothing for "none".
std::string srun_mpi_plugin(const std::string& requested) {
  if (requested == "auto") return backends::slurm::srun_offers_pmix() ? "pmix" : "";
  return requested == "none" ? "" : requested;
}

std::optional<std::vector<backends::TaskLine>> unwrapped_all(std::optional<std::vector<backends::TaskLine>> tasks) {
  if (tasks)
    for (auto& task : *tasks) task = unwrapped(std::move(task));
  return tasks;
}

struct PreparedLaunch {
  std::vector<std::string> argv;
  LineLabeller labeller;
};

PreparedLaunch launch_command(const RunRequest& request, TaskLauncher launcher, const WorldPlan& plan, const AllocationShape& shape,
                              const Environment& env, const std::shared_ptr<std::deque<std::string>>& launcher_reports) {
  backends::TaskLayout layout;
  layout.num_nodes = plan.num_nodes;
  layout.tasks_per_node = plan.workers_per_node;
  layout.cpus_per_task = cpus_per_task(request, plan, shape);
  // Named only when --exclude left nodes out: the launcher's own choice is the allocation's first nodes.
  if (shape.hosts_excluded) layout.hosts.assign(shape.hosts.begin(), shape.hosts.begin() + plan.num_nodes);
  // --relay: each task's unfinished lines reach ddl run, which srun, mpiexec and mpirun would hold.
  layout.task_command = {this_executable(), "exec", "--relay", "--grace-period",
                         fmt::format("{}", static_cast<double>(request.supervision.grace_period.count()) / 1000)};
  if (!plan.gpu_workers) layout.task_command.emplace_back("--cpu");
  if (request.supervision.hang_timeout)
    layout.task_command.insert(
        layout.task_command.end(),
        {"--hang-timeout", fmt::format("{}", static_cast<double>(request.supervision.hang_timeout->count()) / 1000)});
  if (request.gpu_order == GpuOrder::Reversed) layout.task_command.insert(layout.task_command.end(), {"--gpu-order", "reverse"});
  if (request.requeue) layout.task_command.insert(layout.task_command.end(), {"--finish-signal", ::sigabbrev_np(request.requeue->signal)});
  // The user's words cross srun/mpirun/mpiexec with their lone ":"s escaped (program_separators.hpp).
  layout.task_command.insert(layout.task_command.end(), {"--escaped-separators", "--"});
  auto escaped = escape_program_separators(request.command);
  layout.task_command.insert(layout.task_command.end(), escaped.begin(), escaped.end());
  for (const char* name : kExportedToTasks) layout.exported_names.emplace_back(name);
  for (const char* optional : kExportedWhenSet)
    if (env.count(optional)) layout.exported_names.emplace_back(optional);
  for (const auto& name : user_variables_for_other_nodes(env))
    if (std::find(layout.exported_names.begin(), layout.exported_names.end(), name) == layout.exported_names.end())
      layout.exported_names.push_back(name);

  // srun and PALS label whole lines; mpirun's tags need the state of every task's unfinished line.
  // Inside the label, each line is one that ddl exec --relay relayed.
  // srun's own error lines are kept as they stream by (the first 50): at scale the survivors'
  // output would push the first task's end out of the stderr tail.
  const auto& reports = launcher_reports;
  LineLabeller rank_colon = [reports](std::string_view line) -> std::optional<std::vector<backends::TaskLine>> {
    auto task = backends::rank_colon_label(line);
    if (!task) {
      if (line.starts_with("srun: error: ") && reports->size() < 50) reports->emplace_back(line);
      return std::nullopt;
    }
    return std::vector<backends::TaskLine>{unwrapped(std::move(*task))};
  };
  auto openmpi = std::make_shared<backends::pbs::OpenMpiOutput>(starts_relayed_line);
  LineLabeller openmpi_tags = [openmpi](std::string_view line) { return unwrapped_all(openmpi->feed(line)); };
  switch (launcher) {
    case TaskLauncher::Srun: return {backends::slurm::srun_command(layout, srun_mpi_plugin(request.srun_mpi)), rank_colon};
    case TaskLauncher::Pals: return {backends::pbs::pals_command(layout), rank_colon};
    case TaskLauncher::OpenMpi: {
      auto nodefile = lookup(env, "PBS_NODEFILE");
      if (!nodefile) throw UsageError("--launcher mpirun needs a host file, and PBS_NODEFILE is not set", "run it inside a PBS job");
      return {backends::pbs::openmpi_command(layout, *nodefile, ::geteuid() == 0), openmpi_tags};
    }
    default: break;
  }
  throw UsageError("no task launcher for this allocation", "give --launcher srun, mpirun or pals");
}

// The rank and host of the task that failed, as the launcher reported it, and that rank's lines.
void explain_failure(RunOutcome& outcome, TaskLauncher launcher, const AllocationShape& shape, const WorldPlan& plan,
                     const std::deque<std::string>& launcher_reports) {
  if (!outcome.failure) return;
  WorkerFailure& f = *outcome.failure;
  if (!f.never_started.empty()) return;  // the supervisor's own finding, complete
  std::deque<std::string> said(f.stderr_tail.begin(), f.stderr_tail.end());
  std::deque<std::string> reports = launcher_reports;
  reports.insert(reports.end(), said.begin(), said.end());
  std::optional<int> rank;
  if (f.told_by_relay) {
    rank = f.rank;  // and its host, exit code and signal, as its relay said
  } else if (launcher == TaskLauncher::Srun) {
    if (auto task = backends::slurm::failed_task(reports)) {
      rank = task->rank;
      f.host = task->host;
      f.exit_code = task->exit_code;  // srun itself exits with the code of its own SIGTERM
      f.signal = task->signal;
      outcome.exit_code = task->exit_code;
    }
  } else {
    // The counts are bounded, and so is the line searched: std::regex recurses once per
    // character it matches, and a task's stderr may pass through here.
    static const std::regex process_name(R"(Process name:\s{0,16}\[\[\d{1,9},\d{1,9}\],(\d{1,9})\])");
    for (const auto& line : said) {
      std::smatch m;
      if (line.size() <= kLongestSearchedLine && std::regex_search(line, m, process_name)) rank = std::stoi(m[1]);
    }
  }
  if (!rank && f.relayed) {  // a rank's relay said how it ended, and the launcher names no other
    const int stopped = outcome.workers_stopped;
    f = *f.relayed;
    outcome.exit_code = f.exit_code;
    outcome.workers_stopped = stopped;
    rank = f.rank;
  }
  if (!rank) {  // the launcher did not say which task (PALS), or failed itself
    f.rank = -1;
    f.host = launcher == TaskLauncher::Srun ? "srun" : launcher == TaskLauncher::OpenMpi ? "mpirun" : "mpiexec";
    f.stderr_tail.clear();
    outcome.workers_stopped = plan.world_size() - 1;
    return;
  }
  f.rank = *rank;
  outcome.workers_stopped = plan.world_size() - 1;  // the launcher stopped the others
  if (launcher != TaskLauncher::Srun && !f.told_by_relay && f.rank / plan.workers_per_node < static_cast<int>(shape.hosts.size()))
    f.host = shape.hosts[static_cast<size_t>(f.rank / plan.workers_per_node)];
  std::vector<backends::TaskLine> tasks;
  backends::pbs::OpenMpiOutput openmpi(starts_relayed_line);
  for (const auto& line : said) {
    std::optional<std::vector<backends::TaskLine>> labelled;
    if (launcher == TaskLauncher::OpenMpi)
      labelled = unwrapped_all(openmpi.feed(line));
    else if (auto task = backends::rank_colon_label(line))
      labelled = std::vector<backends::TaskLine>{unwrapped(*task)};
    if (labelled) tasks.insert(tasks.end(), labelled->begin(), labelled->end());
  }
  f.stderr_tail = whole_lines_of(f.rank, tasks, kStderrTailLines);
}

}  // namespace

RunOutcome run_in_allocation(const RunRequest& request, const backends::Allocation& allocation, const Environment& env,
                             const std::function<void(const std::string&)>& log) {
  if (request.command.empty()) throw UsageError("no program to run", "put the program after --: ddl run -- python train.py");
  Supervisor supervisor(request.supervision);  // before any thread (the store) starts

  AllocationShape shape = shape_of(allocation, env);
  leave_out_excluded(shape, allocation, request, log);
  const WorldPlan plan = plan_in_allocation(request, allocation, shape);
  // NCCL falling back to TCP between nodes is silent and costly: said before anything starts.
  if (plan.gpu_workers && plan.num_nodes > 1)
    if (auto warning = site_network_warning(env)) std::fprintf(stderr, "ddl: %s\n", warning->c_str());
  if (request.supervision.shown_ranks) request.supervision.shown_ranks->check_within(plan.world_size());
  resolve_program(request.command.front(), lookup(env, "PATH").value_or("/usr/bin:/bin"));  // 127 before anything starts
  const TaskLauncher launcher = choose_launcher(request, allocation.scheduler);

  const RunServices services("0.0.0.0", host_name(), log);  // MASTER_PORT: node 0 when ddl runs in the batch script

  Environment launcher_env = env;
  launcher_env[contract::kStoreAddr] = services.store_addr();
  launcher_env[contract::kStoreToken] = services.store_token();
  launcher_env[contract::kRunId] = fmt::format("{}-{}", allocation.job_id, request.run_tag.substr(0, 4));
  launcher_env[contract::kSize] = std::to_string(plan.world_size());
  launcher_env[contract::kLocalSize] = std::to_string(plan.workers_per_node);
  launcher_env[contract::kNumNodes] = std::to_string(plan.num_nodes);
  launcher_env["DDL_GPU_WORKERS"] = plan.gpu_workers ? "1" : "0";
  launcher_env["DDL_SHARE_GPUS"] = request.launch.share_gpus ? "1" : "0";
  launcher_env["MASTER_ADDR"] = shape.hosts.front();
  launcher_env["MASTER_PORT"] = std::to_string(services.master_port());
  launcher_env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(request.restart_count);
  launcher_env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(request.max_restarts);

  auto launcher_reports = std::make_shared<std::deque<std::string>>();
  PreparedLaunch prepared = launch_command(request, launcher, plan, shape, env, launcher_reports);
  launcher_env["DDL_CPUS_PER_TASK"] = std::to_string(cpus_per_task(request, plan, shape));
  WorkerLaunch task_launcher;
  task_launcher.rank = 0;
  task_launcher.program = resolve_program(prepared.argv.front(), lookup(env, "PATH").value_or("/usr/bin:/bin"));
  task_launcher.argv = prepared.argv;
  task_launcher.env = launcher_env;
  task_launcher.labeller = prepared.labeller;
  task_launcher.interrupt_signal = SIGTERM;  // srun wants two SIGINTs within a second to stop
  // srun answers SIGTERM by killing its tasks at once: they are signalled through Slurm instead,
  // and get the run's grace to save and end.
  if (launcher == TaskLauncher::Srun)
    task_launcher.signal_tasks = [job = allocation.job_id, asked = false, step = std::optional<std::string>()](pid_t srun,
                                                                                                               int sig) mutable {
      // Asked once: the SIGKILL after the grace uses the answer too, and a controller that did not
      // answer is not waited for again (srun then gets the signal itself).
      if (!asked) step = backends::slurm::srun_step(job, srun, host_name());
      asked = true;
      return step && backends::slurm::signal_step(*step, sig);
    };
  for (int rank = 0; rank < plan.world_size(); ++rank) task_launcher.relayed_ranks.push_back(rank);
  RunOutcome outcome = supervisor.run({task_launcher});
  explain_failure(outcome, launcher, shape, plan, *launcher_reports);
  // The supervisor counted the task launcher it stopped; its tasks are the workers.
  if ((outcome.hung_after || outcome.interrupted_by) && outcome.workers_stopped > 0) outcome.workers_stopped = plan.world_size();
  services.report_rejections();
  return outcome;
}

}  // namespace ddl::launcher
