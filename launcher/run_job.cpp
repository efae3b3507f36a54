#include "launcher/run_job.hpp"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/allocation.hpp"
#include "common/error.hpp"
#include "common/random_hex.hpp"
#include "common/worker_contract.hpp"
#include "launcher/allocation_run.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/host.hpp"
#include "launcher/host_exclusion.hpp"
#include "launcher/remote_run.hpp"
#include "launcher/run_services.hpp"
#include "launcher/torch_backend.hpp"
#include "launcher/worker_environment.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

// Several nodes need a scheduler to start workers on the others.
void require_single_node(const LaunchRequest& launch) {
  const int nodes = launch.num_nodes.value_or(1);
  if (nodes <= 1) return;
  throw UsageError(fmt::format("-N {} needs an allocation of {} nodes, and this shell is not inside one", nodes, nodes),
                   fmt::format("get one first (Slurm: salloc -N {0} --gpus-per-node 4; PBS: qsub -I -l select={0}) "
                               "and run ddl inside it, or use -N 1 on this machine",
                               nodes));
}

// libddl reads these in every worker: a bad value is one error here, not one per worker.
void check_libddl_settings(const Environment& env) {
  try {
    if (auto v = lookup(env, contract::kTimeout.name); v && !v->empty()) timeout_setting(*v);
    for (const auto& setting : {contract::kCycleTimeMs, contract::kFusionThreshold})
      if (auto v = lookup(env, setting.name); v && !v->empty()) number_setting(setting, *v);
  } catch (const Error& e) {
    throw UsageError(e.what(), e.hint());
  }
}

std::string what_failed(const WorkerFailure& f) {
  if (!f.description.empty()) return f.description;
  const std::string how = f.signal ? fmt::format("was killed by signal {}", f.signal) : fmt::format("exited with code {}", f.exit_code);
  return f.rank < 0 ? fmt::format("{} {}", f.host, how) : fmt::format("rank {} on {} {}", f.rank, f.host, how);
}

RunOutcome run_once(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log);

// This element's index in a job array (ddl submit --array), as the scheduler gives it.
std::optional<std::string> array_index(const Environment& env) {
  for (const char* name : {"SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX"})
    if (auto index = lookup(env, name); index && !index->empty() && index->size() <= 10 &&
                                        std::all_of(index->begin(), index->end(), [](char c) { return c >= '0' && c <= '9'; }))
      return index;
  return std::nullopt;
}

// The hosts of `found` that failed, each with its reason, on one line.
std::string failed_hosts_said(const PreflightFindings& found) {
  std::vector<std::string> said;
  for (const auto& [host, why] : found.failed_hosts) said.push_back(fmt::format("{} ({})", host, why));
  return fmt::format("{}", fmt::join(said, "; "));
}

struct ProbeRun {
  RunOutcome outcome;
  PreflightFindings found;
};

// The probes of `stage` in the workers' places: the same hosts, launcher and counts as the program
// would get, their output to a folder of their own instead of the terminal.
ProbeRun run_probes(const RunRequest& request, ProbeStage stage, const Environment& env,
                    const std::function<void(const std::string&)>& log) {
  RunRequest probe = request;
  probe.command = {this_executable(), "preflight-probe"};
  if (stage == ProbeStage::AmongAll) probe.command.emplace_back("--among-all");
  if (request.launch.cpu_only) probe.command.emplace_back("--cpu");
  probe.max_restarts = 0;
  probe.supervision.finish_on.reset();
  probe.supervision.shown_ranks = RankSelection::none();
  probe.supervision.hang_timeout.reset();
  // Each host's probe reports by itself: a host whose ssh fails at once must not stop another's
  // probe before its verdict (--preflight exclude would then find no host good).
  probe.supervision.stop_on_failure = stage == ProbeStage::AmongAll;
  std::string dir = (std::filesystem::temp_directory_path() / "ddl-preflight-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr)
    throw Error(fmt::format("cannot make a folder for the preflight probes' output in {}", dir), "check TMPDIR");
  struct Removed {
    std::string dir;
    ~Removed() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } removed{dir};
  probe.supervision.output_dir = dir;
  Environment probe_env = env;
  // A rank that never comes is a failure in a minute, not a hang, unless the user allows longer.
  const auto asked = lookup(env, contract::kTimeout.name);
  if (!asked || asked->empty() || timeout_setting(*asked) < std::chrono::seconds(60)) probe_env[contract::kTimeout.name] = "60";
  ProbeRun run{run_once(probe, probe_env, log), {}};
  // -H hosts go by the names the user gave (an address, an ssh alias): node N is the N-th host left.
  std::vector<std::string> named;
  if (!request.hosts.empty()) {
    const auto hosts =
        request.exclude.empty() ? request.hosts : HostExclusion(request.exclude, nullptr).hosts_left(request.hosts, "", nullptr);
    for (const auto& host : hosts) named.push_back(host.name);
  }
  run.found = read_probe_outputs(dir, [&](const ProbeVerdict& verdict) {
    return verdict.node >= 0 && verdict.node < static_cast<int>(named.size()) ? named[static_cast<size_t>(verdict.node)] : verdict.host;
  });
  // A host that could not be reached, or ran no probe, is said by the launch itself.
  const auto& failure = run.outcome.failure;
  const bool launcher_named = failure && (failure->host == "srun" || failure->host == "mpirun" || failure->host == "mpiexec");
  if (failure && !failure->host.empty() && !launcher_named) run.found.failed_hosts.emplace(failure->host, what_failed(*failure));
  if (run.found.failed_hosts.empty() && !run.outcome.interrupted_by && (!run.found.ranks_unheard.empty() || failure))
    throw Error(
        fmt::format("preflight: the probes did not all report ({})",
                    failure ? what_failed(*failure) : fmt::format("no verdict from rank(s) {}", fmt::join(run.found.ranks_unheard, ","))),
        "run again; if it happens again, `ddl run ... -- true` shows what fails");
  return run;
}

// --preflight: each worker's place checks its own GPU and libddl; where those passed, libddl's
// allreduce runs among all the ranks. Every probe passed: the run goes on as asked. A host failed
// its own: an error naming it and why, or with --preflight exclude the request leaves it out
// (when another host passed). The allreduce failed: an error, since no one host is to blame.
// Returns a probe run's outcome when a signal stopped it.
std::optional<RunOutcome> run_preflight(RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log) {
  log("preflight: probing every worker's place: its GPU and libddl, then libddl's allreduce among all ranks");
  // To leave a host out, the spare ones must be known good: every host is probed, not only -N's.
  RunRequest every_host = request;
  if (request.preflight == PreflightMode::Exclude) {
    every_host.launch.num_nodes.reset();
    if (!every_host.launch.workers_per_node && !every_host.launch.gpus_per_node) every_host.launch.total_workers.reset();
  }
  ProbeRun own = run_probes(every_host, ProbeStage::OnEachHost, env, log);
  if (own.outcome.interrupted_by) return own.outcome;
  if (!own.found.failed_hosts.empty()) {
    std::vector<std::string> hosts;
    for (const auto& [host, why] : own.found.failed_hosts) hosts.push_back(host);
    const std::string listed = fmt::format("{}", fmt::join(hosts, ","));
    const bool another_host_passed = std::any_of(own.found.hosts_passed.begin(), own.found.hosts_passed.end(),
                                                 [&](const std::string& host) { return own.found.failed_hosts.count(host) == 0; });
    if (request.preflight != PreflightMode::Exclude || !another_host_passed)
      throw Error(
          fmt::format("preflight: {} host(s) failed, so the program was not started: {}", hosts.size(), failed_hosts_said(own.found)),
          another_host_passed ? fmt::format("leave them out: --exclude {} (or --preflight exclude, with nodes to spare)", listed)
                              : std::string("fix what it names, or run on other nodes"));
    log(fmt::format("preflight: leaving out {} host(s) that failed: {}", hosts.size(), failed_hosts_said(own.found)));
    request.exclude = request.exclude.empty() ? listed : request.exclude + "," + listed;
  }
  ProbeRun among = run_probes(request, ProbeStage::AmongAll, env, log);
  if (among.outcome.interrupted_by) return among.outcome;
  if (!among.found.failed_hosts.empty())
    throw Error(fmt::format("preflight: libddl's allreduce among the ranks failed, so the program was not started: {}",
                            failed_hosts_said(among.found)),
                "check the network between the hosts (a rank's host name must resolve and its ports be reachable from the others)");
  log(fmt::format("preflight: {} rank(s) on {} host(s) passed", among.found.ranks_passed, among.found.hosts_passed.size()));
  return std::nullopt;
}

}  // namespace

RunOutcome run_job(const RunRequest& request, const Environment& launcher_env, const std::function<void(const std::string&)>& log) {
  check_libddl_settings(launcher_env);
  check_python_runs_the_hook(request.command, request.torch_backend);
  Environment env = with_python_startup_hook(launcher_env, request.torch_backend, this_executable());
  const int requeues = requeue_count(launcher_env);
  env[contract::kRequeueCount] = std::to_string(requeues);
  if (auto index = array_index(launcher_env)) env[contract::kArrayIndex] = *index;
  if (request.straggler_report_every) env[contract::kReportStragglers] = std::to_string(*request.straggler_report_every);
  RunRequest attempt = request;
  std::optional<HeldSignal> held;
  if (request.requeue) {
    held.emplace(request.requeue->signal);
    attempt.supervision.finish_on = finish_request(*request.requeue, launcher_env, request.supervision.grace_period);
  }
  attempt.run_tag = random_hex(8);  // TORCHELASTIC_RUN_ID stays the same across restarts, as torchrun's
  if (request.preflight != PreflightMode::Off)
    if (auto stopped = run_preflight(attempt, env, log)) return *stopped;
  for (attempt.restart_count = 0;; ++attempt.restart_count) {
    // A restart's --output-dir files go on after the failed attempt's, whose last words they keep.
    attempt.supervision.append_output = requeues > 0 || attempt.restart_count > 0;
    RunOutcome outcome = run_once(attempt, env, log);
    if (outcome.finished_on && request.requeue) {
      outcome.requeued = requeue_after_finish(*request.requeue, launcher_env, log);
      // Not requeued, the work is unfinished however the workers ended: not a success.
      if (outcome.requeued)
        outcome.exit_code = 0;
      else if (!outcome.failure)
        outcome.exit_code = 128 + outcome.finished_on;
      return outcome;
    }
    // A signal from outside ends the run, also when it came while a failed attempt was stopping. A
    // hang that --hang-timeout stopped is a failure (a dead NCCL peer, a stuck file system): restarted.
    if ((!outcome.failure && !outcome.hung_after) || outcome.interrupted_by || outcome.signalled || outcome.reader_gone ||
        attempt.restart_count >= request.max_restarts)
      return outcome;
    const std::string what = outcome.failure ? what_failed(*outcome.failure)
                                             : fmt::format("the run hung: nothing moved for {} s (--hang-timeout)",
                                                           std::chrono::duration_cast<std::chrono::seconds>(*outcome.hung_after).count());
    log(fmt::format("{}; restarting all workers ({} of {} restarts)", what, attempt.restart_count + 1, request.max_restarts));
  }
}

namespace {

RunOutcome run_once(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log) {
  if (!request.hosts.empty()) {
    if (request.launcher != TaskLauncher::Auto && request.launcher != TaskLauncher::Local)
      throw UsageError("-H/--hostfile starts workers through the remote shell, and --launcher names another launcher",
                       "drop --launcher, or drop -H/--hostfile to use the allocation's launcher");
    if (request.exclude.empty()) return run_on_hosts(request, env, log);
    RunRequest on_hosts_left = request;
    on_hosts_left.hosts = HostExclusion(request.exclude, nullptr).hosts_left(request.hosts, "the hosts of -H/--hostfile", log);
    return run_on_hosts(on_hosts_left, env, log);
  }
  const backends::Allocation allocation = backends::detect_allocation(env);
  const bool in_allocation = allocation.scheduler != backends::Scheduler::None;
  if (in_allocation && request.launcher != TaskLauncher::Local) return run_in_allocation(request, allocation, env, log);
  if (request.launcher != TaskLauncher::Local && request.launcher != TaskLauncher::Auto)
    throw UsageError("--launcher srun/mpirun/pals needs a Slurm or PBS allocation, and this shell is not inside one",
                     "drop --launcher to start the workers on this machine, or run inside salloc/sbatch/qsub");
  if (!request.exclude.empty())
    throw UsageError(
        "--exclude leaves hosts out of a run on several (-H/--hostfile, or a Slurm or PBS allocation), and this run "
        "is on this machine alone",
        "drop --exclude, or give the hosts with -H/--hostfile");
  require_single_node(request.launch);
  if (request.command.empty()) throw UsageError("no program to run", "put the program after --: ddl run -np 4 -- python train.py");

  // Before anything can start a thread (CUDA, the store), so no thread ever takes SIGINT.
  Supervisor supervisor(request.supervision);

  const GpuInventory gpus = request.launch.cpu_only ? GpuInventory{{}, "--cpu"} : in_order(discover_gpus(env), request.gpu_order);
  const WorldPlan plan = plan_world(request.launch, gpus.count());
  if (request.supervision.shown_ranks) request.supervision.shown_ranks->check_within(plan.world_size());
  const std::string program = resolve_program(request.command.front(), lookup(env, "PATH").value_or("/usr/bin:/bin"));
  // Finding the GPUs may take seconds (nvidia-smi): Ctrl-C meanwhile starts no worker.
  if (const int sig = supervisor.signal_before_run()) return stopped_before_start(sig);

  // One node: workers reach node 0 over loopback.
  const RunServices services("127.0.0.1", "127.0.0.1", log);
  RunContext run = services.serve(run_context(request));
  if (const int sig = supervisor.signal_before_run()) return stopped_before_start(sig);
  run.master_addr = "127.0.0.1";
  run.cpus_on_node = request.cpus_per_task ? *request.cpus_per_task * plan.workers_per_node : available_cpus();

  std::vector<WorkerLaunch> launches;
  for (const WorkerSlot& slot : plan.slots_on_node(0))
    launches.push_back({slot.rank, program, request.command, worker_environment(env, plan, slot, run, gpus)});
  RunOutcome outcome = supervisor.run(launches);
  services.report_rejections();
  return outcome;
}

}  // namespace

}  // namespace ddl::launcher
