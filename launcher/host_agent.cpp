#include "launcher/host_agent.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"
#include "launcher/host.hpp"
#include "launcher/remote_job.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

constexpr size_t kLongestJob = 64 << 20;

// The first line of `fd`, read a byte at a time so that nothing after it (the control lines the
// supervisor reads later) is consumed.
std::string read_job_line(int fd) {
  std::string line;
  for (char c = 0; line.size() < kLongestJob;) {
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error("the launching host sent no job (its connection ended first)", "ddl agent is started by ddl run -H, not by hand");
    if (c == '\n') return line;
    line.push_back(c);
  }
  throw Error("the job the launching host sent is too long");
}

// This host's GPUs for the job's workers; a job whose GPU use was left to each host (gpus_if_present)
// becomes one with GPU workers here when this host has GPUs.
GpuInventory gpus_for(RemoteJob& job) {
  if (!job.plan.gpu_workers && !job.gpus_if_present) return {{}, "--cpu"};
  GpuInventory gpus = in_order(discover_gpus(job.env), job.gpu_order);
  if (!job.plan.gpu_workers) {
    if (gpus.count() == 0) return {{}, "no GPU on this host"};
    job.plan.gpu_workers = true;
  }
  if (gpus.count() == 0)
    throw UsageError(fmt::format("{} has no GPU visible and the run has GPU workers", host_name()),
                     "give every host GPUs, or run CPU workers with --cpu");
  require_gpus_for_node(job.plan, job.node_rank, gpus, job.share_gpus, host_name());
  return gpus;
}

}  // namespace

void require_gpus_for_node(const WorldPlan& plan, int node_rank, const GpuInventory& gpus, bool share_gpus, const std::string& host) {
  const int workers = plan.workers_on(node_rank);
  if (plan.gpu_workers && !share_gpus && gpus.count() < workers)
    throw UsageError(fmt::format("{} has {} GPU(s) for {} GPU workers", host, gpus.count(), workers),
                     "run fewer workers on it (fewer slots), or add --share-gpus");
}

int run_host_agent(int control_fd) {
  RemoteJob job = decode_remote_job(read_job_line(control_fd));
  SupervisorOptions options;
  options.grace_period = std::chrono::milliseconds(job.grace_period_ms);
  options.host = host_name();
  options.control_fd = control_fd;
  options.relay_with_rank_labels = true;
  if (job.hang_timeout_ms > 0) options.hang_timeout = std::chrono::milliseconds(job.hang_timeout_ms);
  Supervisor supervisor(options);  // before any thread could start

  Environment env = job.env;
  if (!job.working_dir.empty() && ::chdir(job.working_dir.c_str()) != 0)
    std::fprintf(stderr, "ddl: note: %s has no directory %s (%s); its workers start in the remote shell's directory\n",
                 options.host.c_str(), job.working_dir.c_str(), std::strerror(errno));
  else if (!job.working_dir.empty())
    env["PWD"] = job.working_dir;  // as a shell would set it there (the launching host's PWD stays home)
  // Programs the agent runs itself (nvidia-smi) come from the run's PATH, as the workers' do.
  for (const char* name : {"PATH", "LD_LIBRARY_PATH"})
    if (auto value = lookup(job.env, name)) ::setenv(name, value->c_str(), 1);
  const GpuInventory gpus = gpus_for(job);
  const std::string program = resolve_program(job.command.front(), lookup(job.env, "PATH").value_or("/usr/bin:/bin"));
  RunContext run = job.run;
  run.cpus_on_node =
      job.cpus_per_task
          ? static_cast<int>(std::min<long long>(INT_MAX, static_cast<long long>(*job.cpus_per_task) * job.plan.workers_on(job.node_rank)))
          : available_cpus();

  std::vector<WorkerLaunch> launches;
  for (const WorkerSlot& slot : job.plan.slots_on_node(job.node_rank))
    launches.push_back({slot.rank, program, job.command, worker_environment(env, job.plan, slot, run, gpus)});
  const RunOutcome outcome = supervisor.run(launches);
  if (outcome.failure)
    std::fprintf(stderr, "%srank=%d code=%d signal=%d\n", kAgentFailurePrefix, outcome.failure->rank, outcome.failure->exit_code,
                 outcome.failure->signal);
  return outcome.exit_code;
}

}  // namespace ddl::launcher
