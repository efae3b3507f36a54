#include "cli/run_command.hpp"

#include "cli/program_usage.hpp"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "cli/validators.hpp"
#include "common/environment.hpp"
#include "common/error.hpp"
#include "launcher/end_by_signal.hpp"
#include "launcher/failure_hints.hpp"
#include "launcher/host.hpp"
#include "launcher/host_list.hpp"
#include "launcher/pending_output.hpp"
#include "launcher/rank_selection.hpp"
#include "launcher/remote_run.hpp"
#include "launcher/run_job.hpp"

namespace ddl::cli {

namespace {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string outcome_text(const launcher::RunOutcome& o) {
  std::string text;
  if (o.failure) {
    const auto& f = *o.failure;
    std::string how = f.signal ? fmt::format("was killed by {} (exit code {})", signal_name(f.signal), f.exit_code)
                               : fmt::format("exited with code {}", f.exit_code);
    if (!f.description.empty())
      text = fmt::format("ddl: error: {}{}\n", f.description,
                         o.workers_stopped > 0 ? fmt::format("; stopped {} other worker(s)", o.workers_stopped) : "");
    else if (f.rank < 0)
      text = fmt::format("ddl: error: {} {} without naming a failed rank (see its messages above)\n", f.host, how);
    else
      text = fmt::format("ddl: error: rank {} on {} {}; stopped {} other worker(s)\n", f.rank, f.host, how, o.workers_stopped);
    if (!f.stderr_tail.empty()) {
      text += fmt::format("ddl: last lines of rank {}'s stderr:\n", f.rank);
      for (const auto& line : f.stderr_tail) text += fmt::format("  | {}\n", line);
    }
    if (const std::string hint = launcher::failure_hint(f.stderr_tail, launcher::this_executable()); !hint.empty())
      text += fmt::format("hint: {}\n", hint);
  } else if (o.interrupted_by) {
    text = fmt::format("ddl: interrupted by {}; stopped {} worker(s)\n", signal_name(o.interrupted_by), o.workers_stopped);
  } else if (o.finished_on && !o.requeued) {
    text = fmt::format("ddl: error: the run ended on {} (--requeue-signal) and the job was not requeued{}\n", signal_name(o.finished_on),
                       o.workers_overran ? "; workers that did not end in time were stopped" : "");
  } else if (o.hung_after) {
    text = fmt::format("ddl: error: the run hung: nothing moved for {} s (--hang-timeout; the stacks are above); stopped {} worker(s)\n",
                       std::chrono::duration_cast<std::chrono::seconds>(*o.hung_after).count(), o.workers_stopped);
  }
  return text;
}

void print_outcome(const launcher::RunOutcome& o) {
  const std::string text = outcome_text(o);
  if (o.output_given_up)  // a signal ended the wait for a reader that stopped reading: no waiting now either
    launcher::write_without_waiting(STDERR_FILENO, text);
  else  // all of it: a failed rank's last lines may hold a NUL byte, where fputs would stop
    std::fwrite(text.data(), 1, text.size(), stderr);
}

// The program and its arguments: what followed "--", or else what CLI11 did not recognise. An
// unrecognised word that looks like an option is a mistyped ddl flag, not a program.
std::vector<std::string> program_to_run(const std::optional<std::vector<std::string>>& after_dashes,
                                        const std::vector<std::string>& unrecognised) {
  const std::vector<std::string>& command = after_dashes ? *after_dashes : unrecognised;
  const std::string* stray = after_dashes ? (unrecognised.empty() ? nullptr : &unrecognised.front())
                                          : (!command.empty() && command.front().starts_with("-") ? &command.front() : nullptr);
  if (stray != nullptr)
    throw UsageError("ddl run has no option " + *stray, "see `ddl run --help`; the program and its arguments go after --");
  return command;
}

}  // namespace

struct RunFlags {
  int total = 0, nodes = 0, per_node = 0, gpus_per_node = 0, cpus_per_task = 0, max_restarts = 0;
  bool cpu = false, share_gpus = false, no_prefix = false;
  std::string prefix = "rank";
  double grace_seconds = 10;
  double hang_seconds = 0;
  std::string hang_action = "stop";
  std::string requeue_signal;
  std::string straggler_every;
  int max_requeues = 5;
  double requeue_grace_seconds = 0;
  std::string output_dir;
  std::string ranks;
  std::string launcher = "auto";
  std::string gpu_order = "as-listed";
  std::string mpi = "auto";
  std::string hosts, hostfile, rsh, exclude;
  std::string preflight;
  std::string torch_backend;
};

namespace {

std::optional<launcher::RequeuePolicy> requeue_policy(const CLI::App& app, const RunFlags& f) {
  if (app.count("--requeue-signal") > 0 && f.requeue_signal.empty())
    throw UsageError("--requeue-signal must not be empty", "give the signal Slurm sends before the time limit: --requeue-signal USR1");
  if (f.requeue_signal.empty()) {
    for (const char* flag : {"--max-requeues", "--requeue-grace"})
      if (app.count(flag) > 0) throw UsageError(fmt::format("{} is for --requeue-signal", flag), "add --requeue-signal USR1, or drop it");
    return std::nullopt;
  }
  launcher::RequeuePolicy policy;
  policy.signal = launcher::requeue_signal_named(f.requeue_signal, "--requeue-signal");
  policy.max_requeues = f.max_requeues;
  if (app.count("--requeue-grace") > 0) {
    if (f.requeue_grace_seconds < 1)
      throw UsageError("--requeue-grace must be 1 second or more", "give the seconds the workers need to save");
    policy.grace = std::chrono::milliseconds(static_cast<long long>(f.requeue_grace_seconds * 1000));
  }
  return policy;
}

}  // namespace

RunCommand::RunCommand(CLI::App& app) : flags_(std::make_shared<RunFlags>()) {
  RunFlags& f = *flags_;
  app_ = app.add_subcommand("run", "Start workers of a program (here, or on the nodes of a Slurm/PBS allocation) and supervise them");
  app_->add_option("-n,--np", f.total, "Workers in all (also written -np)")->transform(whole_count());
  app_->add_option("-N,--nodes", f.nodes, "Nodes (more than 1 needs an allocation; inside one: all of its nodes)")
      ->transform(whole_count());
  app_->add_option("--nproc-per-node,--nproc_per_node", f.per_node, "Workers per node (torchrun's spelling)")->transform(whole_count());
  app_->add_option("--gpus-per-node", f.gpus_per_node, "GPU workers per node, one per GPU")->transform(whole_count());
  app_->add_option("-c,--cpus-per-task", f.cpus_per_task, "Cores per worker (srun -c, PALS --depth, OMP_NUM_THREADS)")
      ->transform(whole_count());
  app_->add_flag("--cpu", f.cpu, "CPU workers: assign no GPU even when there are some");
  app_->add_flag("--share-gpus", f.share_gpus, "Allow more GPU workers than GPUs (round robin)");
  app_->add_option("--grace-period", f.grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str()
      ->check(seconds_at_most(86400));
  app_->add_option("--hang-timeout", f.hang_seconds,
                   "Seconds without output from any worker and without a completed libddl op after which the run is hung: every "
                   "rank's stacks are shown, and the run stops (exit 124)")
      ->check(seconds_at_most(365.0 * 86400));
  app_->add_option("--hang-action", f.hang_action, "What a hang (and Ctrl-\\) does after showing the stacks: stop the run, or report only")
      ->check(CLI::IsMember({"stop", "report"}))
      ->capture_default_str();
  app_->add_option("--max-restarts,--max_restarts", f.max_restarts,
                   "After a worker fails, stop all and start them again, up to this many times (torchrun's); 0: never")
      ->capture_default_str()
      ->transform(whole_number_between(0, 1000000));
  app_->add_option("--requeue-signal", f.requeue_signal,
                   "In a Slurm batch job: on this signal (USR1 or USR2; Slurm's --signal=B:USR1@120 before the time "
                   "limit) pass it on for the workers to save and end, then requeue the job (scontrol requeue)");
  app_->add_option("--max-requeues", f.max_requeues, "With --requeue-signal: requeue the job at most this many times in all")
      ->capture_default_str()
      ->transform(whole_number_between(0, 1000000));
  app_->add_option("--requeue-grace", f.requeue_grace_seconds,
                   "With --requeue-signal: seconds the workers have to save and end (default: until shortly before the time limit)")
      ->check(seconds_at_most(365.0 * 86400));
  app_->add_option("--report-stragglers", f.straggler_every,
                   "Say which ranks the others waited for in libddl ops (rank 0, at the end; every SECONDS too when given)")
      ->expected(0, 1);
  auto* no_prefix = app_->add_flag("--no-prefix", f.no_prefix, "Do not prefix output lines with the worker's rank");
  app_->add_option("--prefix", f.prefix, "What labels each output line: rank ([3] ...), host ([node7:3] ...) or none")
      ->check(CLI::IsMember({"rank", "host", "none"}))
      ->capture_default_str()
      ->excludes(no_prefix);
  app_->add_option("--ranks", f.ranks,
                   "Show only these ranks' output, e.g. 0,4-7 (every rank's still goes to --output-dir, and a failed "
                   "rank's last lines to the error)")
      ->check(not_empty());
  app_->add_option("--output-dir", f.output_dir, "Also write each worker's output to DIR/rank.N.{out,err}")
      ->check(not_empty())
      ->transform(home_expanded_path());
  app_->add_option("--launcher", f.launcher,
                   "Who starts the workers: auto (srun in Slurm, mpiexec/mpirun in PBS, else ddl), local, srun, mpirun, pals")
      ->check(CLI::IsMember({"auto", "local", "srun", "mpirun", "pals"}))
      ->capture_default_str();
  app_->add_option("--mpi", f.mpi,
                   "srun's --mpi: auto (pmix when Slurm offers it), none (faster start; libddl and torch need no PMIx), or a plugin")
      ->capture_default_str()
      ->check(not_empty());
  auto* hosts =
      app_->add_option("-H,--hosts", f.hosts, "Run on these hosts over ssh: host1:4,host2:4 (host:slots; a host named N times has N slots)")
          ->check(not_empty());
  app_->add_option("--hostfile", f.hostfile, "Run on the hosts of FILE over ssh: lines 'host slots=4' or 'host:4'")
      ->check(not_empty())
      ->transform(home_expanded_path())
      ->excludes(hosts);
  app_->add_option("--rsh", f.rsh,
                   fmt::format("Remote shell for -H/--hostfile, split at blanks (default: {})", launcher::kDefaultRemoteShell))
      ->check(not_empty());
  app_->add_option("--exclude", f.exclude,
                   "Leave these hosts out (node1,node7; a Slurm node range inside Slurm): of -H/--hostfile's, or of the "
                   "allocation's nodes")
      ->type_name("HOSTS")
      ->check(not_empty());
  app_->add_option("--preflight", f.preflight,
                   "Before the program, probe every worker's place (a CUDA context on its GPU, libddl's allreduce among all "
                   "ranks) and stop, naming each host that failed and why; with 'exclude', leave those hosts out instead")
      ->type_name("[exclude]")
      ->expected(0, 1);
  app_->add_option("--gpu-order", f.gpu_order, "as-listed, or reverse: local rank 0 gets the node's last GPU (Polaris)")
      ->check(CLI::IsMember({"as-listed", "reverse"}))
      ->capture_default_str();
  app_->add_option("--torch-backend", f.torch_backend,
                   "Run the program's torch.distributed world group, and the groups that name no backend, on this "
                   "backend (ddl: libddl), whatever the script names")
      ->check(not_empty());
  // Everything from the program name on belongs to the program, with or without "--".
  app_->prefix_command();
  show_program_in_usage(*app_);
  app_->footer("Example: ddl run -np 4 -- python3 train.py --epochs 3");
}

int RunCommand::execute(const std::optional<std::vector<std::string>>& program) const {
  const RunFlags& f = *flags_;
  launcher::RunRequest request;
  auto set_if_given = [](std::optional<int>& target, int value) {
    if (value > 0) target = value;
  };
  set_if_given(request.launch.total_workers, f.total);
  set_if_given(request.launch.num_nodes, f.nodes);
  set_if_given(request.launch.workers_per_node, f.per_node);
  set_if_given(request.launch.gpus_per_node, f.gpus_per_node);
  request.launch.cpu_only = f.cpu;
  if (f.cpus_per_task > 0) request.cpus_per_task = f.cpus_per_task;
  request.srun_mpi = f.mpi;
  request.launch.share_gpus = f.share_gpus;
  request.command = program_to_run(program, app_->remaining());
  if (!f.hosts.empty()) request.hosts = launcher::parse_host_flag(f.hosts);
  if (!f.hostfile.empty()) request.hosts = launcher::read_hostfile(f.hostfile);
  if (!f.rsh.empty() && request.hosts.empty()) throw UsageError("--rsh is for -H/--hostfile", "add -H host1:4,host2:4, or drop --rsh");
  request.remote_shell = f.rsh;
  request.exclude = f.exclude;
  if (app_->count("--preflight") > 0) {
    if (!f.preflight.empty() && f.preflight != "exclude")
      throw UsageError(fmt::format("--preflight {}: not a preflight mode", f.preflight),
                       "give --preflight alone (stop when a probe fails) or --preflight exclude (leave failed hosts out)");
    request.preflight = f.preflight == "exclude" ? launcher::PreflightMode::Exclude : launcher::PreflightMode::Check;
  }
  request.max_restarts = f.max_restarts;
  request.torch_backend = f.torch_backend;
  request.launcher = f.launcher == "local"    ? launcher::TaskLauncher::Local
                     : f.launcher == "srun"   ? launcher::TaskLauncher::Srun
                     : f.launcher == "mpirun" ? launcher::TaskLauncher::OpenMpi
                     : f.launcher == "pals"   ? launcher::TaskLauncher::Pals
                                              : launcher::TaskLauncher::Auto;
  request.gpu_order = f.gpu_order == "reverse" ? launcher::GpuOrder::Reversed : launcher::GpuOrder::AsListed;
  request.supervision.grace_period = std::chrono::milliseconds(static_cast<long long>(f.grace_seconds * 1000));
  if (app_->count("--hang-timeout") > 0) {
    if (f.hang_seconds < 1)
      throw UsageError("--hang-timeout must be 1 second or more", "give the seconds of quiet that mean a hang, e.g. --hang-timeout 600");
    request.supervision.hang_timeout = std::chrono::milliseconds(static_cast<long long>(f.hang_seconds * 1000));
  }
  request.supervision.hang_report_only = f.hang_action == "report";
  request.requeue = requeue_policy(*app_, f);
  if (app_->count("--report-stragglers") > 0) {
    const auto every = f.straggler_every.empty() ? std::optional<long long>(0) : whole_number(f.straggler_every, 365LL * 24 * 3600);
    if (!every)
      throw UsageError(fmt::format("--report-stragglers {}: not a whole number of seconds", f.straggler_every),
                       "give how often to report, e.g. --report-stragglers 600, or nothing for a report at the end only");
    request.straggler_report_every = static_cast<int>(*every);
  }
  request.supervision.prefix_output = !f.no_prefix && f.prefix != "none";
  request.supervision.prefix_with_host = f.prefix == "host";
  request.supervision.output_dir = f.output_dir;
  if (!f.ranks.empty()) request.supervision.shown_ranks = launcher::RankSelection::parse(f.ranks);
  request.supervision.host = launcher::host_name();

  auto log = [](const std::string& message) { std::fprintf(stderr, "ddl: %s\n", message.c_str()); };
  launcher::RunOutcome outcome = launcher::run_job(request, current_environment(), log);
  print_outcome(outcome);
  return launcher::run_exit_code_or_end(outcome);  // Ctrl-C: dies of SIGINT, so that a shell loop of runs stops
}

}  // namespace ddl::cli
