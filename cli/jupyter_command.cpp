#include "cli/jupyter_command.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>

#include <fmt/format.h>

#include "backends/job_script.hpp"
#include "backends/jobs.hpp"
#include "backends/jupyter_session.hpp"
#include "backends/site_profile.hpp"
#include "cli/batch_flags.hpp"
#include "cli/job_output.hpp"
#include "cli/validators.hpp"
#include "common/error.hpp"
#include "launcher/host.hpp"

namespace ddl::cli {

struct JupyterFlags {
  std::string site;
  std::map<std::string, std::string> options;
  std::vector<std::string> directives;
  std::string exclude;
  std::string program;
  std::string environment;
  int gpus = -1;
  int local_port = 0;
  int timeout = 600;
  bool dry_run = false;
  std::string job;
};

namespace {

std::atomic<bool> g_interrupted{false};

void on_interrupt(int /*unused*/) { g_interrupted = true; }

// Ctrl-C or SIGTERM while waiting for the server: stop waiting, then cancel the job.
void catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

void print_connection(const backends::JupyterSession& s, const backends::JupyterEndpoint& at, int local_port) {
  const int lport = local_port > 0 ? local_port : at.port;
  std::printf("Jupyter (%s) is up on %s:%d, job %s.\n", s.program.c_str(), at.host.c_str(), at.port, s.job.c_str());
  std::printf("On your laptop, run:\n  %s\n", backends::ssh_tunnel_command(s, at, lport).c_str());
  std::printf("then open:\n  %s\n", backends::jupyter_url(s, lport).c_str());
  std::printf("Again later: ddl jupyter tunnel %s    Stop it: ddl jupyter stop %s\n", s.job.c_str(), s.job.c_str());
}

}  // namespace

JupyterCommand::JupyterCommand(CLI::App& app) : flags_(std::make_shared<JupyterFlags>()) {
  JupyterFlags& f = *flags_;
  app_ = app.add_subcommand("jupyter", "Jupyter on a compute node, with the exact ssh tunnel to reach it");
  app_->require_subcommand(1);
  start_ = app_->add_subcommand("start", "Submit a job running Jupyter, wait until it is up, print the ssh tunnel and URL");
  start_->add_option("--site", f.site, "Site profile (ddl sites lists them)")->required();
  add_job_options(*start_, f.options, false);
  add_directive_and_exclude(*start_, f.directives, f.exclude);
  start_->add_option("--gpus", f.gpus, "GPUs for the notebook (default: 1 on a GPU site, else 0)")
      ->transform(whole_number_between(0, 1024));
  start_->add_option("--program", f.program, "lab, notebook or server (default: the site's, else lab)")
      ->check(CLI::IsMember({"lab", "notebook", "server"}));
  start_->add_option("--env", f.environment, "A conda environment to activate, or the path of a virtualenv")
      ->transform(home_expanded_path());
  start_->add_option("--local-port", f.local_port, "The laptop's port for the tunnel (default: the server's)")
      ->transform(whole_number_between(1, 65535));
  start_->add_option("--timeout", f.timeout, "Seconds to wait for the server")
      ->capture_default_str()
      ->transform(whole_number_between(1, 86400));
  start_->add_flag("--dry-run", f.dry_run, "Print the batch script instead of submitting it");
  tunnel_ = app_->add_subcommand("tunnel", "Print the ssh tunnel and URL of a running session again");
  tunnel_->add_option("job", f.job, "Job id")->required();
  tunnel_->add_option("--local-port", f.local_port, "The laptop's port for the tunnel")->transform(whole_number_between(1, 65535));
  stop_ = app_->add_subcommand("stop", "Cancel the session's job and remove its files");
  stop_->add_option("job", f.job, "Job id")->required();
}

int JupyterCommand::execute() const {
  if (start_->parsed()) return start();
  if (tunnel_->parsed()) return tunnel();
  return stop();
}

int JupyterCommand::start() const {
  const JupyterFlags& f = *flags_;
  backends::check_jupyter_environment(f.environment);
  const backends::SiteProfile site = backends::load_site(f.site);
  const std::string program = !f.program.empty() ? f.program : site.jupyter.value("program", std::string("lab"));
  backends::JobRequest job;
  job.options = f.options;
  job.extra_directives = f.directives;
  if (!f.exclude.empty()) job.exclude = f.exclude;
  job.options["nodes"] = "1";
  job.options["gpus_per_node"] = std::to_string(f.gpus >= 0 ? f.gpus : (backends::partition_gpus(site, job.options) > 0 ? 1 : 0));
  job.gpus_flag = "--gpus";
  if (!job.options.count("job_name")) job.options["job_name"] = "ddl-jupyter";
  job.ddl_program = launcher::this_executable();
  job.ddl_version = DDL_VERSION;
  if (f.dry_run) {
    backends::JupyterSession example;
    example.name = "jupyter-SESSION";
    example.dir = backends::jupyter_sessions_path();  // a dry run makes nothing
    example.program = program;
    job.body = backends::jupyter_body(example, f.environment);
    std::fputs(backends::render_job_script(site, job).text.c_str(), stdout);
    return 0;
  }
  job.body = {"true"};  // the real body names the session, which is made only once the rules pass
  backends::check_site_rules(site, job);

  backends::JupyterSession session = backends::new_jupyter_session(program);
  session.site = site.name;
  session.scheduler = site.scheduler;
  session.login_host = site.login_host.empty() ? launcher::host_name() : site.login_host;
  session.jump_host = site.jupyter.value("jump_host", std::string());
  job.body = backends::jupyter_body(session, f.environment);
  try {
    session.job = backends::submit_job(site.scheduler, backends::render_job_script(site, job).text);
  } catch (...) {
    backends::remove_jupyter_session(session);
    throw;
  }
  catch_interrupts();
  backends::JupyterEndpoint at;
  bool saved = false;
  try {
    backends::save_jupyter_session(session);
    saved = true;
    std::printf("submitted job %s to %s (site %s): jupyter %s; waiting up to %d s for it\n", session.job.c_str(),
                backends::scheduler_name(site.scheduler), site.name.c_str(), program.c_str(), f.timeout);
    std::fflush(stdout);
    at = backends::wait_for_jupyter(session, std::chrono::seconds(f.timeout), print_job_status, [] { return g_interrupted.load(); });
  } catch (const Error&) {
    if (::isatty(STDOUT_FILENO)) std::printf("\n");
    auto state = backends::job_state(session.scheduler, session.job);
    const bool still_queued_or_running = state && !state->finished;
    // Waiting timed out: the job is left for `tunnel`, as the message says. Anything else (an
    // interrupt, a session that could not be saved, a job that ended) leaves nothing behind.
    if (still_queued_or_running && saved && !g_interrupted) throw;
    if (still_queued_or_running) {
      try {  // the error that ended the wait is the one to show
        backends::cancel_job(session.scheduler, session.job);
      } catch (const Error& e) {
        std::fprintf(stderr, "ddl: warning: job %s was not cancelled: %s\n", session.job.c_str(), e.what());
      }
    }
    backends::remove_jupyter_session(session);
    throw;
  }
  if (::isatty(STDOUT_FILENO)) std::printf("\n");
  print_connection(session, at, f.local_port);
  return 0;
}

int JupyterCommand::tunnel() const {
  const backends::JupyterSession session = backends::load_jupyter_session(flags_->job);
  auto at = backends::jupyter_endpoint(session);
  if (!at)
    throw Error(fmt::format("job {} has not written where Jupyter listens yet", session.job), "wait a little; ddl status " + session.job);
  print_connection(session, *at, flags_->local_port);
  return 0;
}

int JupyterCommand::stop() const {
  const backends::JupyterSession session = backends::load_jupyter_session(flags_->job);
  auto state = backends::job_state(session.scheduler, session.job);
  if (state && !state->finished) backends::cancel_job(session.scheduler, session.job);
  backends::remove_jupyter_session(session);
  std::printf("stopped Jupyter job %s and removed its session files\n", session.job.c_str());
  return 0;
}

}  // namespace ddl::cli
