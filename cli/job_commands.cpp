#include "cli/job_commands.hpp"

#include <cstdio>

#include <fmt/format.h>

#include "backends/jobs.hpp"
#include "cli/job_output.hpp"
#include "common/error.hpp"

namespace ddl::cli {

JobCommands::JobCommands(CLI::App& app) : job_(std::make_shared<std::string>()) {
  status_ = app.add_subcommand("status", "How a batch job is (or all of yours)");
  status_->add_option("job", *job_, "Job id");
  cancel_ = app.add_subcommand("cancel", "Cancel a batch job");
  cancel_->add_option("job", *job_, "Job id")->required();
}

int JobCommands::execute() const {
  const backends::Scheduler scheduler = backends::local_scheduler();
  if (cancel_->parsed()) {
    if (backends::cancel_job(scheduler, *job_))
      std::printf("cancelled job %s\n", job_->c_str());
    else
      std::printf("job %s had already ended or is ending: nothing to cancel\n", job_->c_str());
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
