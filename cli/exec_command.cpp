#include "cli/exec_command.hpp"

#include "cli/program_usage.hpp"
#include "cli/validators.hpp"

#include "common/environment.hpp"
#include "common/error.hpp"
#include "launcher/exec_task.hpp"
#include "launcher/program_separators.hpp"
#include "launcher/requeue.hpp"

namespace ddl::cli {

struct ExecFlags {
  bool cpu = false;
  std::string gpu_order = "as-listed";
  bool relay = false;
  bool escaped_separators = false;
  double grace_seconds = 10;
  double hang_seconds = 0;
  std::string finish_signal;
};

ExecCommand::ExecCommand(CLI::App& app) : flags_(std::make_shared<ExecFlags>()) {
  ExecFlags& f = *flags_;
  app_ = app.add_subcommand("exec", "Run one task of a job started by srun/mpirun/mpiexec with ddl's worker environment");
  app_->add_flag("--cpu", f.cpu, "A CPU worker: pin no GPU");
  app_->add_option("--gpu-order", f.gpu_order, "as-listed, or reverse: local rank 0 gets the last GPU (Polaris)")
      ->check(CLI::IsMember({"as-listed", "reverse"}))
      ->capture_default_str();
  app_->add_flag("--relay", f.relay,
                 "Stay, and pass the program's output on as lines labelled with its rank, unfinished lines too (what ddl run uses)");
  app_->add_flag("--escaped-separators", f.escaped_separators,
                 "The program's words come with each lone ':' escaped as '\\:' (and '\\:' as '\\\\:'), as ddl run passes "
                 "them through srun/mpirun, which would take a ':' for the start of another program");
  app_->add_option("--grace-period", f.grace_seconds, "With --relay: seconds between SIGTERM and SIGKILL when stopping the program")
      ->capture_default_str()
      ->check(seconds_at_most(86400));
  app_->add_option("--hang-timeout", f.hang_seconds,
                   "With --relay: relay the program's libddl progress, and its stacks after this many seconds without output "
                   "or progress (what ddl run --hang-timeout uses)")
      ->check(seconds_at_most(365.0 * 86400));
  app_->add_option("--finish-signal", f.finish_signal,
                   "With --relay: ddl run's --requeue-signal (USR1 or USR2); once it came, the task ends with 0 however the "
                   "program ends, so that srun does not kill the other tasks while they save");
  app_->prefix_command();
  show_program_in_usage(*app_);
  app_->footer("Example (inside sbatch): srun --ntasks-per-node 4 ddl exec -- python3 train.py");
}

int ExecCommand::execute(const std::optional<std::vector<std::string>>& program) const {
  launcher::ExecRequest request;
  request.command = program ? *program : app_->remaining();
  if (!program && !request.command.empty() && request.command.front().starts_with("-"))
    throw UsageError("ddl exec has no option " + request.command.front(), "see `ddl exec --help`; the program goes after --");
  if (flags_->escaped_separators) request.command = launcher::unescape_program_separators(std::move(request.command));
  request.cpu_only = flags_->cpu;
  request.gpu_order = flags_->gpu_order == "reverse" ? launcher::GpuOrder::Reversed : launcher::GpuOrder::AsListed;
  request.relay_output = flags_->relay;
  request.grace_period = std::chrono::milliseconds(static_cast<long long>(flags_->grace_seconds * 1000));
  if (flags_->hang_seconds > 0) request.hang_timeout = std::chrono::milliseconds(static_cast<long long>(flags_->hang_seconds * 1000));
  if (!flags_->finish_signal.empty()) request.finish_signal = launcher::requeue_signal_named(flags_->finish_signal, "--finish-signal");
  return launcher::exec_task(request, current_environment());
}

}  // namespace ddl::cli
