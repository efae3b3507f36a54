#include "launcher/remote_run.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/launch_layout.hpp"
#include "common/error.hpp"
#include "common/net_address.hpp"
#include "launcher/host.hpp"
#include "launcher/host_agent.hpp"
#include "launcher/relayed_output.hpp"
#include "launcher/remote_job.hpp"
#include "launcher/run_services.hpp"
#include "launcher/worker_environment.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

namespace {

int fewest_slots(const std::vector<HostSlots>& hosts, size_t count) {
  int fewest = INT_MAX;
  for (size_t i = 0; i < count; ++i) fewest = std::min(fewest, hosts[i].slots);
  return fewest;
}

long long slots_of(const std::vector<HostSlots>& hosts) {
  long long slots = 0;
  for (const auto& h : hosts) slots += h.slots;
  return slots;
}

void require_few_enough_workers(long long workers, const char* what, const char* hint) {
  if (workers > kMostWorkers)
    throw UsageError(fmt::format("{} {} workers, more than the {} one run can have", what, workers, kMostWorkers), hint);
}

// -np alone: the fewest first hosts that hold it evenly within their slots, if any do.
std::optional<size_t> hosts_for_even_total(int total, const std::vector<HostSlots>& hosts) {
  for (size_t k = 1; k <= hosts.size(); ++k)
    if (total % static_cast<int>(k) == 0 && total / static_cast<int>(k) <= fewest_slots(hosts, k)) return k;
  return std::nullopt;
}

// `total` workers over `hosts` in their order, each up to its slots, as mpirun and horovodrun fill
// them; the hosts left without a worker are not used.
std::vector<int> filled_in_order(int total, const std::vector<HostSlots>& hosts) {
  std::vector<int> sizes;
  for (const auto& h : hosts) {
    if (total == 0) break;
    sizes.push_back(std::min(total, h.slots));
    total -= sizes.back();
  }
  return sizes;
}

// How many workers each used host runs when no count per host was given: -np spread evenly where
// an even spread fits (over the fewest first hosts, or over -N's), else hosts filled in order;
// without -np, every slot of every host used.
std::vector<int> workers_on_hosts(const LaunchRequest& r, const std::vector<HostSlots>& candidates) {
  const long long slots = slots_of(candidates);
  if (!r.total_workers) {
    require_few_enough_workers(slots, "every slot of the hosts makes", "give fewer slots, or -np");
    std::vector<int> sizes;
    for (const auto& h : candidates) sizes.push_back(h.slots);
    return sizes;
  }
  const int total = *r.total_workers;
  if (total > slots)
    throw UsageError(fmt::format("-np {} is more than the {} slots of {}", total, slots,
                                 r.num_nodes ? fmt::format("the first {} host(s)", candidates.size()) : std::string("the hosts")),
                     "give the hosts more slots (-H host1:8,host2:8), or run fewer workers");
  std::optional<size_t> even;
  if (!r.num_nodes)
    even = hosts_for_even_total(total, candidates);
  else if (total % static_cast<int>(candidates.size()) == 0 &&
           total / static_cast<int>(candidates.size()) <= fewest_slots(candidates, candidates.size()))
    even = candidates.size();
  if (even) return std::vector<int>(*even, total / static_cast<int>(*even));
  std::vector<int> sizes = filled_in_order(total, candidates);
  if (r.num_nodes && sizes.size() < candidates.size())
    throw UsageError(fmt::format("-np {} fills the slots of only {} of the -N {} hosts", total, sizes.size(), candidates.size()),
                     fmt::format("use -N {}, or leave -N out", sizes.size()));
  return sizes;
}

void require_slots(const std::vector<HostSlots>& hosts, int per_host) {
  for (const auto& h : hosts)
    if (h.slots < per_host)
      throw UsageError(fmt::format("host {} has {} slot(s) and {} workers per host were asked", h.name, h.slots, per_host),
                       fmt::format("give it more slots ({}:{}), or run fewer workers per host", h.name, per_host));
}

std::vector<std::string> words_of(const std::string& command) {
  std::istringstream in(command);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) throw UsageError("--rsh is empty", fmt::format("give the remote shell command, e.g. --rsh '{}'", kDefaultRemoteShell));
  return words;
}

// The remote shell's program, found before anything starts: a missing one is --rsh's mistake (or a
// missing ssh), not the user's program's, which the message would otherwise read as.
std::string remote_shell_program(const std::string& name, const Environment& env) {
  try {
    return resolve_program(name, lookup(env, "PATH").value_or("/usr/bin:/bin"));
  } catch (const ProgramNotRunnable& e) {
    throw UsageError(
        fmt::format("the remote shell for -H/--hostfile: {}", e.what()),
        fmt::format("install ssh here (openssh-client), or give the remote shell with --rsh (default: {})", kDefaultRemoteShell));
  }
}

std::string single_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What a remote host's shell said of its own (not its workers' lines), kept to explain a failure.
struct RemoteHost {
  std::string name;
  int first_rank = 0;
  std::shared_ptr<std::deque<std::string>> said = std::make_shared<std::deque<std::string>>();
};

// The agent's relayed lines (relayed_output.hpp) are its workers'; its failure line and errors are
// kept for the summary and not shown; anything else is the remote shell's or the agent's own
// message, shown as it is and kept.
LineLabeller remote_labeller(const std::shared_ptr<std::deque<std::string>>& said) {
  return [said](std::string_view line) -> std::optional<std::vector<backends::TaskLine>> {
    if (auto task = relayed_line(line)) return std::vector<backends::TaskLine>{std::move(*task)};
    said->emplace_back(line);
    if (said->size() > 200) said->pop_front();
    // The agent's failure report and its own error: the summary says them once, for the host.
    if (line.starts_with(kAgentFailurePrefix) || line.starts_with("ddl: error: ") || line.starts_with("hint: "))
      return std::vector<backends::TaskLine>{};
    return std::nullopt;
  };
}

WorkerLaunch remote_launch(const RemoteJob& job, const RemoteHost& host, const std::vector<std::string>& shell) {
  WorkerLaunch launch;
  launch.rank = host.first_rank;
  launch.argv = shell;
  launch.argv.push_back(host.name);
  launch.argv.push_back("exec " + single_quoted(this_executable()) + " agent");
  launch.env = job.env;
  launch.labeller = remote_labeller(host.said);
  launch.control_input = encode_remote_job(job) + "\n";
  launch.host = host.name;
  return launch;
}

// The last line the remote shell or agent said that starts with `prefix`, without it.
std::optional<std::string> last_said(const std::deque<std::string>& said, std::string_view prefix) {
  for (auto it = said.rbegin(); it != said.rend(); ++it)
    if (it->starts_with(prefix)) return it->substr(prefix.size());
  return std::nullopt;
}

// A remote host's launch failed: name the worker its agent reported, else what went wrong.
void explain_remote_failure(WorkerFailure& f, const RemoteHost& host, const std::string& shell_name) {
  const std::deque<std::string>& said = *host.said;
  std::vector<std::string> lines_of_shell = f.stderr_tail;
  f.host = host.name;
  if (auto report = last_said(said, kAgentFailurePrefix)) {
    int rank = 0, code = 0, signal = 0;
    if (std::sscanf(report->c_str(), "rank=%d code=%d signal=%d", &rank, &code, &signal) == 3) {
      f.rank = rank;
      f.exit_code = code;
      f.signal = signal;
      std::vector<backends::TaskLine> relayed;
      for (const auto& line : lines_of_shell)
        if (auto task = relayed_line(line)) relayed.push_back(std::move(*task));
      f.stderr_tail = whole_lines_of(rank, relayed, kStderrTailLines);
      return;
    }
  }
  f.rank = -1;
  f.stderr_tail.clear();
  if (auto error = last_said(said, "ddl: error: ")) {
    f.description = fmt::format("on {}: {}", host.name, *error);
    if (auto hint = last_said(said, "hint: ")) f.description += fmt::format(" ({})", *hint);
    return;
  }
  std::string last = said.empty() ? std::string("it said nothing") : said.back();
  if (f.signal != 0) {
    f.description = fmt::format("lost {}: its {} was killed by {}", host.name, shell_name,
                                f.signal == SIGKILL ? "SIGKILL" : fmt::format("signal {}", f.signal));
    return;
  }
  if (f.exit_code == 127)
    f.description = fmt::format("cannot start ddl on {} at {} ({}: {})", host.name, this_executable(), shell_name, last);
  else if (f.exit_code == 255)
    f.description = fmt::format("cannot reach {} through {}: {}", host.name, shell_name, last);
  else
    f.description = fmt::format("{} to {} ended with code {}: {}", shell_name, host.name, f.exit_code, last);
  f.description += f.exit_code == 127   ? " — install ddl at the same path on every host (a shared file system does)"
                   : f.exit_code == 255 ? " — check that the host is up, runs sshd and takes your key (ssh it by hand), or give --rsh"
                                        : "";
}

// Two names of this host (localhost and its own name) would be two nodes planned on the same
// GPUs and cores, each checked alone: their ranks would share GPUs without --share-gpus.
void refuse_this_host_twice(const std::vector<HostSlots>& hosts, const std::vector<bool>& local) {
  std::vector<std::string> names;
  int slots = 0;
  for (size_t i = 0; i < hosts.size(); ++i)
    if (local[i]) {
      names.push_back(hosts[i].name);
      slots += hosts[i].slots;
    }
  if (names.size() < 2) return;
  throw UsageError(fmt::format("the host list names this host {} times ({})", names.size(), fmt::join(names, ", ")),
                   fmt::format("name it once, with all its slots: {}:{}", names.front(), slots));
}

}  // namespace

HostsPlan plan_on_hosts(const LaunchRequest& launch, const std::vector<HostSlots>& hosts, int gpus_here) {
  const size_t named = hosts.size();
  if (launch.num_nodes && static_cast<size_t>(*launch.num_nodes) > named)
    throw UsageError(fmt::format("-N {} but the host list names {} host(s)", *launch.num_nodes, named),
                     "name more hosts, or use a smaller -N");
  const std::vector<HostSlots> candidates(hosts.begin(), hosts.begin() + (launch.num_nodes ? *launch.num_nodes : static_cast<long>(named)));
  if (launch.workers_per_node || launch.gpus_per_node) {  // the same number on each host: planned as on -N nodes
    LaunchRequest on_candidates = launch;
    on_candidates.num_nodes = static_cast<int>(candidates.size());
    require_few_enough_workers(static_cast<long long>(candidates.size()) * launch.workers_per_node.value_or(*launch.gpus_per_node),
                               "the hosts times the count per host make", "use fewer hosts (-N)");
    const WorldPlan plan = plan_world(on_candidates, gpus_here);
    require_slots(candidates, plan.workers_per_node);
    return {plan, candidates};
  }
  // The hosts' slots decide each host's count (workers_on_hosts checks -np against them);
  // each host checks its own GPUs against its own count (run_on_hosts here, the agent elsewhere),
  // naming itself.
  const std::vector<int> sizes = workers_on_hosts(launch, candidates);
  const WorldPlan plan = plan_with_node_sizes(sizes, wants_gpu_workers(launch, gpus_here));
  return {plan, std::vector<HostSlots>(candidates.begin(), candidates.begin() + static_cast<long>(sizes.size()))};
}

RunOutcome run_on_hosts(const RunRequest& request, const Environment& env, const std::function<void(const std::string&)>& log) {
  if (request.command.empty()) throw UsageError("no program to run", "put the program after --: ddl run -H a:4,b:4 -- python train.py");
  const std::vector<std::string> shell = words_of(request.remote_shell.empty() ? kDefaultRemoteShell : request.remote_shell);
  Supervisor supervisor(request.supervision);  // before any thread (the store) starts

  // Each name is looked up (a DNS timeout can take seconds): a signal meanwhile ends the run
  // between two lookups, before anything started.
  std::vector<bool> local;
  for (const auto& h : request.hosts) {
    if (const int sig = supervisor.signal_before_run()) return stopped_before_start(sig);
    local.push_back(is_this_host(h.name));
  }
  refuse_this_host_twice(request.hosts, local);
  const bool any_local = std::find(local.begin(), local.end(), true) != local.end();
  // GPUs of this host decide for the plan when it runs workers; else --gpus-per-node is trusted
  // and each host's agent checks its own.
  GpuInventory gpus_here{{}, "--cpu"};
  if (!request.launch.cpu_only) gpus_here = in_order(discover_gpus(env), request.gpu_order);
  int gpus_for_plan = any_local ? gpus_here.count() : request.launch.gpus_per_node.value_or(0);
  if (request.launch.share_gpus && request.launch.gpus_per_node) gpus_for_plan = std::max(gpus_for_plan, 1);
  const HostsPlan hosts = plan_on_hosts(request.launch, request.hosts, gpus_for_plan);
  const WorldPlan& plan = hosts.plan;
  if (request.supervision.shown_ranks) request.supervision.shown_ranks->check_within(plan.world_size());
  for (int node = 0; node < plan.num_nodes; ++node)
    if (local[static_cast<size_t>(node)])
      require_gpus_for_node(plan, node, gpus_here, request.launch.share_gpus, hosts.hosts[static_cast<size_t>(node)].name);

  // Only a run with a remote host needs the remote shell (-H localhost:2 runs without ssh).
  const bool any_remote = std::any_of(local.begin(), local.begin() + static_cast<long>(hosts.hosts.size()), [](bool l) { return !l; });
  const std::string shell_program = any_remote ? remote_shell_program(shell.front(), env) : std::string();
  std::optional<std::string> here;  // this host's address as the other hosts reach it
  for (size_t i = 0; i < hosts.hosts.size(); ++i)
    if (!local[i]) {
      if (const int sig = supervisor.signal_before_run()) return stopped_before_start(sig);
      try {
        std::string towards = address_towards(hosts.hosts[i].name);
        if (!here) here = towards;
      } catch (const Error& e) {
        throw UsageError(e.what() + std::string(" (named by the host list)"), e.hint());
      }
    }
  const std::string program = resolve_program(request.command.front(), lookup(env, "PATH").value_or("/usr/bin:/bin"));

  const RunServices services(here ? "0.0.0.0" : "127.0.0.1", here.value_or("127.0.0.1"), log);
  RunContext run = services.serve(run_context(request));  // MASTER_PORT reserved here: node 0 is usually this host
  run.master_addr = local[0] ? here.value_or("127.0.0.1") : hosts.hosts[0].name;

  RemoteJob job;
  job.plan = plan;
  job.gpu_order = request.gpu_order;
  job.share_gpus = request.launch.share_gpus;
  job.gpus_if_present = !any_local && !request.launch.cpu_only && !request.launch.gpus_per_node;
  job.cpus_per_task = request.cpus_per_task;
  job.run = run;
  job.command = request.command;
  std::error_code ec;
  job.working_dir = std::filesystem::current_path(ec).string();
  job.env = forwarded_environment(env);
  job.grace_period_ms = request.supervision.grace_period.count();
  if (request.supervision.hang_timeout) job.hang_timeout_ms = request.supervision.hang_timeout->count();

  std::vector<WorkerLaunch> launches;
  std::map<int, RemoteHost> remote_by_rank;  // by the first rank of each remote host
  for (int node = 0; node < plan.num_nodes; ++node) {
    if (local[static_cast<size_t>(node)]) {
      RunContext here_run = run;
      here_run.cpus_on_node = request.cpus_per_task ? *request.cpus_per_task * plan.workers_on(node) : available_cpus();
      for (const WorkerSlot& slot : plan.slots_on_node(node))
        launches.push_back({slot.rank, program, request.command, worker_environment(env, plan, slot, here_run, gpus_here)});
      continue;
    }
    RemoteHost host{hosts.hosts[static_cast<size_t>(node)].name, plan.first_rank_on(node)};
    job.node_rank = node;
    WorkerLaunch launch = remote_launch(job, host, shell);
    for (const WorkerSlot& slot : plan.slots_on_node(node)) launch.relayed_ranks.push_back(slot.rank);
    launch.program = shell_program;
    launches.push_back(std::move(launch));
    remote_by_rank.emplace(host.first_rank, host);
  }

  RunOutcome outcome = supervisor.run(launches);
  if (outcome.failure) {
    if (auto it = remote_by_rank.find(outcome.failure->rank); it != remote_by_rank.end())
      explain_remote_failure(*outcome.failure, it->second, shell.front());
    outcome.exit_code = outcome.failure->exit_code;
  }
  const bool never_started = outcome.failure && !outcome.failure->never_started.empty();  // nothing to stop
  if ((outcome.failure && !never_started) || outcome.interrupted_by || outcome.hung_after)
    outcome.workers_stopped = plan.world_size() - (outcome.failure ? 1 : 0);
  services.report_rejections();
  return outcome;
}

}  // namespace ddl::launcher
