#include "cli/submit_command.hpp"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <deque>

#include <fmt/format.h>

#include "backends/job_script.hpp"
#include "backends/jobs.hpp"
#include "backends/site_profile.hpp"
#include "launcher/host.hpp"
#include "runtime/src/common/error.hpp"

namespace ddl::cli {

namespace {

std::string describe(const backends::JobState& s) {
  std::string line = fmt::format("job {} {}", s.id, s.state);
  if (!s.nodes.empty()) line += " on " + s.nodes;
  if (!s.reason.empty()) line += fmt::format(" ({})", s.reason);
  if (s.finished && s.exit_code) line += fmt::format(", exit code {}", *s.exit_code);
  return line;
}

void print_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  if (!in) {
    std::printf("(no output file at %s)\n", path.c_str());
    return;
  }
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::printf("--- last %zu lines of %s ---\n", tail.size(), path.c_str());
  for (const auto& line : tail) std::printf("%s\n", line.c_str());
}

}  // namespace

// One status line that rewrites itself on a terminal, and one line per change elsewhere.
void print_job_status(const backends::JobState& s) {
  if (::isatty(STDOUT_FILENO)) std::printf("\r\033[K%s", describe(s).c_str());
  else std::printf("%s\n", describe(s).c_str());
  std::fflush(stdout);
}

void add_job_options(CLI::App& app, std::map<std::string, std::string>& options, bool workers) {
  auto option = [&](const char* names, const char* key, const char* help) {
    app.add_option_function<std::string>(names, [&options, key](const std::string& v) { options[key] = v; }, help);
  };
  if (workers) {
    option("-N,--nodes", "nodes", "Nodes");
    option("--gpus-per-node", "gpus_per_node", "GPUs (and workers) per node; default: all the site's");
  }
  option("-t,--time", "time", "Time limit, HH:MM:SS");
  option("-A,--account", "account", "Account/project to charge");
  option("-q,--queue,--qos", "queue", "Slurm QOS / PBS queue");
  option("-p,--partition", "partition", "Slurm partition");
  option("-C,--constraint", "constraint", "Slurm node features (Perlmutter: gpu)");
  option("-J,--job-name", "job_name", "Job name");
  option("-o,--output", "output", "Output file (Slurm: %j is the job id)");
  option("--image", "image", "Container image (Shifter/Apptainer/Singularity, as the site has)");
  option("--comment", "comment", "Slurm --comment (Neuron: the application, e.g. pytorch)");
  option("--mem", "mem", "Memory per node");
  option("--filesystems", "filesystems", "PBS -l filesystems= (Polaris: home:eagle)");
  option("-c,--cpus-per-task", "cpus_per_task", "Cores per worker");
  option("-d,--dependency", "dependency", "Start after another job: afterok:ID");
  option("--gpu-type", "gpu_type", "GPU model where the site asks for one (Alliance: a100, h100)");
}

struct SubmitFlags {
  std::string site;
  std::map<std::string, std::string> options;
  std::vector<std::string> directives;
  int signal_before = 0;
  bool dry_run = false, wait = false;
  int wait_timeout = 0;
};

SubmitCommand::SubmitCommand(CLI::App& app) : flags_(std::make_shared<SubmitFlags>()) {
  SubmitFlags& f = *flags_;
  app_ = app.add_subcommand("submit", "Write a batch script from a site profile and submit it (sbatch/qsub)");
  app_->add_option("--site", f.site, "Site profile (ddl sites lists them)")->required();
  add_job_options(*app_, f.options, true);
  app_->add_option("--directive", f.directives, "An extra batch directive, e.g. --directive '--exclusive' (repeatable)");
  app_->add_option("--signal-before", f.signal_before, "Send SIGUSR1 to the workers this many seconds before the time limit, and requeue")
      ->check(CLI::Range(1, 86400));
  app_->add_flag("--dry-run", f.dry_run, "Print the script instead of submitting it");
  app_->add_flag("--wait", f.wait, "Follow the job until it ends, then show its output's tail; exit with its code");
  app_->add_option("--wait-timeout", f.wait_timeout, "Give up following after this many seconds (default: no limit)");
  app_->prefix_command();
  app_->footer("Example: ddl submit --site perlmutter -N 2 -t 01:00:00 -q regular -A m1234_g -- python train.py");
}

int SubmitCommand::execute(const std::optional<std::vector<std::string>>& program) const {
  const SubmitFlags& f = *flags_;
  backends::JobRequest job;
  job.options = f.options;
  job.extra_directives = f.directives;
  if (f.signal_before > 0) job.signal_before_seconds = f.signal_before;
  job.command = program ? *program : app_->remaining();
  const std::vector<std::string> stray = program ? app_->remaining() : std::vector<std::string>{};
  if (!stray.empty() || (!program && !job.command.empty() && job.command.front().starts_with("-")))
    throw UsageError("ddl submit has no option " + (stray.empty() ? job.command.front() : stray.front()),
                     "see `ddl submit --help`; the program goes after --");
  job.ddl_program = launcher::this_executable();
  job.ddl_version = DDL_VERSION;

  const backends::SiteProfile site = backends::load_site(f.site);
  const backends::JobScript script = backends::render_job_script(site, job);
  if (f.dry_run) {
    std::fputs(script.text.c_str(), stdout);
    return 0;
  }
  const std::string id = backends::submit_job(site.scheduler, script.text);
  auto state = backends::job_state(site.scheduler, id);
  const std::string output = state && !state->output.empty() ? state->output : script.output;
  std::printf("submitted job %s to %s (site %s); output: %s\n", id.c_str(), site.scheduler == "slurm" ? "Slurm" : "PBS",
              site.name.c_str(), output.c_str());
  std::fflush(stdout);
  if (!f.wait) return 0;

  const auto timeout = std::chrono::seconds(f.wait_timeout > 0 ? f.wait_timeout : 365 * 24 * 3600);
  auto last = backends::follow_job(site.scheduler, id, timeout, print_job_status);
  if (::isatty(STDOUT_FILENO)) std::printf("\n");
  if (!last || !last->finished) {
    std::fprintf(stderr, "ddl: error: stopped following job %s before it ended (--wait-timeout)\n", id.c_str());
    return 1;
  }
  print_tail(last->output.empty() ? output : last->output, 20);
  return last->exit_code.value_or(0);
}

SitesCommand::SitesCommand(CLI::App& app) : name_(std::make_shared<std::string>()) {
  app_ = app.add_subcommand("sites", "List the site profiles, or show one with where each value came from");
  show_ = app_->add_subcommand("show", "Show one site profile");
  show_->add_option("name", *name_, "Site name")->required();
}

int SitesCommand::execute() const {
  if (!show_->parsed()) {
    for (const auto& name : backends::site_names()) {
      const auto site = backends::load_site(name);
      std::printf("%-12s %-5s %s\n", name.c_str(), site.scheduler.c_str(), site.description.c_str());
    }
    std::printf("(user profiles: %s)\n", backends::user_sites_dir().c_str());
    return 0;
  }
  const auto p = backends::load_site(*name_);
  auto from = [&](const std::string& field) {
    auto it = p.origin.find(field);
    return it == p.origin.end() ? std::string("default") : it->second;
  };
  auto row = [&](const std::string& field, const std::string& value) {
    std::printf("%-16s %-40s  [%s]\n", field.c_str(), value.c_str(), from(field).c_str());
  };
  std::printf("site %s\n", p.name.c_str());
  row("description", p.description);
  row("scheduler", p.scheduler);
  row("login_host", p.login_host);
  row("gpus_per_node", std::to_string(p.gpus_per_node));
  row("cores_per_node", std::to_string(p.cores_per_node));
  row("gpu_vendor", p.gpu_vendor);
  row("launcher", p.launcher);
  row("gpu_order", p.gpu_order);
  for (const auto& [option, value] : p.defaults)
    std::printf("%-16s %-40s  [%s]\n", ("defaults." + option).c_str(), value.c_str(), from("defaults." + option).c_str());
  row("required", fmt::format("{}", fmt::join(p.required, ", ")));
  for (const auto& [option, rule] : p.patterns)
    std::printf("%-16s %-40s  [%s]\n", ("patterns." + option).c_str(), rule.regex.c_str(), from("patterns").c_str());
  for (const auto& [option, why] : p.forbidden)
    std::printf("%-16s %-40s  [%s]\n", ("forbidden." + option).c_str(), why.c_str(), from("forbidden").c_str());
  row("gpu_request", p.gpu_request);
  row("directives", fmt::format("{}", fmt::join(p.directives, " | ")));
  row("module_use", fmt::format("{}", fmt::join(p.module_use, " ")));
  row("modules", fmt::format("{}", fmt::join(p.modules, " ")));
  row("setup", fmt::format("{}", fmt::join(p.setup, " ; ")));
  for (const auto& [name, value] : p.environment)
    std::printf("%-16s %-40s  [%s]\n", ("environment." + name).c_str(), value.c_str(), from("environment").c_str());
  if (p.container) row("container", fmt::format("{}: {}", p.container->kind, fmt::join(p.container->wrap, " ")));
  row("notes", p.notes);
  return 0;
}

JobCommands::JobCommands(CLI::App& app) : job_(std::make_shared<std::string>()) {
  status_ = app.add_subcommand("status", "How a batch job is (or all of yours)");
  status_->add_option("job", *job_, "Job id");
  cancel_ = app.add_subcommand("cancel", "Cancel a batch job");
  cancel_->add_option("job", *job_, "Job id")->required();
}

int JobCommands::execute() const {
  const std::string scheduler = backends::local_scheduler();
  if (cancel_->parsed()) {
    backends::cancel_job(scheduler, *job_);
    std::printf("cancelled job %s\n", job_->c_str());
    return 0;
  }
  if (!job_->empty()) {
    auto state = backends::job_state(scheduler, *job_);
    if (!state) throw Error(fmt::format("the scheduler does not know job {} (any more)", *job_), "ddl status lists your jobs");
    std::printf("%s\n", describe(*state).c_str());
    if (!state->output.empty()) std::printf("output: %s\n", state->output.c_str());
    return 0;
  }
  auto jobs = backends::my_jobs(scheduler);
  if (jobs.empty()) std::printf("no jobs\n");
  for (const auto& j : jobs) std::printf("%s\n", describe(j).c_str());
  return 0;
}

}  // namespace ddl::cli
