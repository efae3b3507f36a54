#include "cli/submit_command.hpp"

#include "cli/program_usage.hpp"

#include <string.h>
#include <unistd.h>

#include <cstdio>

#include "backends/job_script.hpp"
#include "backends/jobs.hpp"
#include "backends/site_profile.hpp"
#include "cli/batch_flags.hpp"
#include "cli/job_output.hpp"
#include "cli/validators.hpp"
#include "common/error.hpp"
#include "launcher/host.hpp"
#include "launcher/requeue.hpp"

namespace ddl::cli {

struct SubmitFlags {
  std::string site;
  std::map<std::string, std::string> options;
  std::vector<std::string> directives;
  int signal_before = 0;
  std::string signal;
  bool requeue = false;
  int max_requeues = -1;
  std::string array;
  std::string exclude;
  bool dry_run = false, wait = false;
  int wait_timeout = 0;
};

SubmitCommand::SubmitCommand(CLI::App& app) : flags_(std::make_shared<SubmitFlags>()) {
  SubmitFlags& f = *flags_;
  app_ = app.add_subcommand("submit", "Write a batch script from a site profile and submit it (sbatch/qsub)");
  app_->add_option("--site", f.site, "Site profile (ddl sites lists them)")->required();
  add_job_options(*app_, f.options, true);
  add_directive_and_exclude(*app_, f.directives, f.exclude);
  app_->add_option("--signal-before", f.signal_before,
                   "Send the workers --signal this many seconds before the time limit (Slurm; with --requeue default 120)")
      ->transform(whole_number_between(1, 65535));  // sbatch's limit for --signal's time
  app_->add_option("--signal", f.signal, "The signal --signal-before and --requeue send: USR1 (default) or USR2")->check(not_empty());
  app_->add_flag("--requeue", f.requeue,
                 "Slurm: before the time limit the workers get --signal to save and end, then the job is requeued and continues "
                 "(ddl run --requeue-signal); PBS: the job is rerunnable (-r y)");
  app_->add_option("--max-requeues", f.max_requeues, "With --requeue on Slurm: requeue the job at most this many times (default 5)")
      ->transform(whole_number_between(0, 1000000));
  app_->add_option("--array", f.array,
                   "A job array: one job per index, e.g. 0-15%4 (16 elements, at most 4 at once); each element's workers get "
                   "DDL_ARRAY_INDEX (Slurm --array, PBS -J)")
      ->check(not_empty());
  app_->add_flag("--dry-run", f.dry_run, "Print the script instead of submitting it");
  app_->add_flag("--wait", f.wait, "Follow the job until it ends, then show its output's tail; exit with its code");
  app_->add_option("--wait-timeout", f.wait_timeout, "Give up following after this many seconds (default: no limit)")
      ->transform(whole_number_between(0, 365 * 24 * 3600))
      ->needs("--wait");
  app_->prefix_command();
  show_program_in_usage(*app_);
  app_->footer("Example: ddl submit --site perlmutter -N 2 -t 01:00:00 -q regular -A m1234_g -- python train.py");
}

namespace {

// A submitted array: its elements, and with --wait each element's end (exit: the first element's
// non-zero code, else 0).
int follow_array(const backends::SiteProfile& site, const std::string& id, const std::string& output, std::optional<int> wait_timeout) {
  std::printf("submitted job array %s to %s (site %s); output: %s\n", id.c_str(), backends::scheduler_name(site.scheduler),
              site.name.c_str(), output.c_str());
  std::fflush(stdout);
  if (!wait_timeout) return 0;
  const auto timeout = std::chrono::seconds(*wait_timeout > 0 ? *wait_timeout : 365 * 24 * 3600);
  const auto ended = backends::follow_array(site.scheduler, id, timeout, print_job_status);
  if (::isatty(STDOUT_FILENO)) std::printf("\n");
  if (!ended) {
    std::fprintf(stderr, "ddl: error: stopped following job array %s before every element ended (--wait-timeout)\n", id.c_str());
    return 1;
  }
  if (ended->empty()) {
    std::fprintf(stderr, "ddl: error: the scheduler never listed an element of job array %s\n", id.c_str());
    return 1;
  }
  int code = 0;
  for (const auto& element : *ended) {
    std::printf("element %s: %s, exit %s\n", element.id.c_str(), element.state.c_str(),
                element.exit_code ? std::to_string(*element.exit_code).c_str() : "unknown");
    if (code == 0) code = backends::ended_job_exit_code(element);
  }
  return code;
}

}  // namespace

int SubmitCommand::execute(const std::optional<std::vector<std::string>>& program) const {
  const SubmitFlags& f = *flags_;
  backends::JobRequest job;
  job.options = f.options;
  job.extra_directives = f.directives;
  if (f.signal_before > 0) job.signal_before_seconds = f.signal_before;
  job.requeue = f.requeue;
  if (!f.signal.empty()) {
    if (!f.requeue && f.signal_before == 0)
      throw UsageError("--signal is for --signal-before or --requeue", "add one of them, or drop --signal");
    job.signal = ::sigabbrev_np(launcher::requeue_signal_named(f.signal, "--signal"));
  }
  if (f.max_requeues >= 0) {
    if (!f.requeue) throw UsageError("--max-requeues is for --requeue", "add --requeue, or drop --max-requeues");
    job.max_requeues = f.max_requeues;
  }
  if (!f.array.empty()) job.array = f.array;
  if (!f.exclude.empty()) job.exclude = f.exclude;
  job.command = program ? *program : app_->remaining();
  const std::vector<std::string> stray = program ? app_->remaining() : std::vector<std::string>{};
  if (!stray.empty() || (!program && !job.command.empty() && job.command.front().starts_with("-")))
    throw UsageError("ddl submit has no option " + (stray.empty() ? job.command.front() : stray.front()),
                     "see `ddl submit --help`; the program goes after --");
  job.ddl_program = launcher::this_executable();
  job.ddl_version = DDL_VERSION;

  const backends::SiteProfile site = backends::load_site(f.site);
  const backends::JobScript script = backends::render_job_script(site, job);
  if (job.array && site.scheduler == backends::Scheduler::Slurm && script.output.find("%a") == std::string::npos)
    std::fprintf(stderr,
                 "ddl: note: --output %s has no %%a, so every element of the array writes to that one file (%%A_%%a keeps them apart)\n",
                 script.output.c_str());
  if (f.dry_run) {
    std::fputs(script.text.c_str(), stdout);
    return 0;
  }
  const std::string id = backends::submit_job(site.scheduler, script.text);
  if (job.array) return follow_array(site, id, script.output, f.wait ? std::optional<int>(f.wait_timeout) : std::nullopt);
  std::optional<backends::JobState> state;
  try {  // the job is in the queue whatever the answer: its id is said in any case
    state = backends::job_state(site.scheduler, id);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddl: warning: job %s was submitted, but asking about it failed: %s\n", id.c_str(), e.what());
    if (f.wait) std::fprintf(stderr, "ddl: warning: following it all the same\n");
  }
  std::string output = state && !state->output.empty() ? state->output : script.output;
  if (!state && site.scheduler == backends::Scheduler::Slurm)  // what Slurm would have said: the job's id in its place
    for (size_t at; (at = output.find("%j")) != std::string::npos;) output.replace(at, 2, id);
  std::printf("submitted job %s to %s (site %s); output: %s\n", id.c_str(), backends::scheduler_name(site.scheduler), site.name.c_str(),
              output.c_str());
  std::fflush(stdout);
  if (!f.wait) return 0;

  const auto timeout = std::chrono::seconds(f.wait_timeout > 0 ? f.wait_timeout : 365 * 24 * 3600);
  auto last = backends::follow_job(site.scheduler, id, timeout, print_job_status);
  if (::isatty(STDOUT_FILENO)) std::printf("\n");
  if (!last || !last->finished) {
    if (!last || last->vanished)
      std::fprintf(stderr, "ddl: error: %s %s job %s before ddl saw it end: how it ended is unknown here (sacct or qstat -x may know)\n",
                   backends::scheduler_name(site.scheduler), last ? "stopped listing" : "never listed", id.c_str());
    else
      std::fprintf(stderr, "ddl: error: stopped following job %s before it ended (--wait-timeout)\n", id.c_str());
    return 1;
  }
  print_tail(last->output.empty() ? output : last->output, 20);
  return backends::ended_job_exit_code(*last);
}

}  // namespace ddl::cli
