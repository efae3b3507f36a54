#include "backends/slurm/slurm_launch.hpp"

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/command.hpp"
#include "common/error.hpp"

namespace ddl::backends::slurm {

namespace {

// The most of anything ddl starts: what -np allows.
constexpr long long kMostCount = 1 << 20;

// The count Slurm wrote at the start of `var`'s value `text`: digits, followed by nothing or by
// one of `may_follow` ("4(x2),2" for SLURM_JOB_CPUS_PER_NODE). Anything else (a value set by hand:
// "abc", 99999999999) is an error naming the variable; read with atoi it would wrap around or become 0.
int slurm_count(const char* var, std::string_view text, std::string_view may_follow = "") {
  const size_t digits = std::min(text.find_first_not_of("0123456789"), text.size());
  const bool ends_well = digits == text.size() || may_follow.find(text[digits]) != std::string_view::npos;
  const std::optional<long long> n = whole_number(text.substr(0, digits), kMostCount);
  if (!n || !ends_well)
    throw Error(fmt::format("{}='{}' is not a count Slurm sets (at most {})", var, text, kMostCount),
                fmt::format("unset {} if you set it yourself: inside a Slurm job Slurm sets it", var));
  return static_cast<int>(*n);
}

// SLURM_GPUS_PER_NODE: "a100:4" or "4" -> 4; "a100:2,v100:1" -> 3.
int count_in_gpu_spec(const std::string& spec) {
  long long total = 0;
  std::stringstream parts(spec);
  for (std::string part; std::getline(parts, part, ',');) {
    const auto colon = part.rfind(':');
    total += slurm_count("SLURM_GPUS_PER_NODE", std::string_view(part).substr(colon == std::string::npos ? 0 : colon + 1));
  }
  if (total > kMostCount) slurm_count("SLURM_GPUS_PER_NODE", spec);  // says why
  return static_cast<int>(total);
}

// How many GPUs a list of GPU indices names ("0,1,2", or "0-3,6" in Slurm's range form): its
// entries, not its commas (",," names none).
int gpus_listed(const std::string& list) {
  long long total = 0;
  std::stringstream entries(list);
  for (std::string entry; std::getline(entries, entry, ',');) {
    if (entry.empty()) continue;
    const size_t dash = entry.find('-');
    const auto first = whole_number(std::string_view(entry).substr(0, dash), kMostCount);
    const auto last = dash == std::string::npos ? first : whole_number(std::string_view(entry).substr(dash + 1), kMostCount);
    total += first && last && *first <= *last ? *last - *first + 1 : kMostCount + 1;
    if (total > kMostCount)
      throw Error(fmt::format("SLURM_JOB_GPUS='{}' is not a list of GPU indices Slurm sets (at most {})", list, kMostCount),
                  "unset SLURM_JOB_GPUS if you set it yourself: inside a Slurm job Slurm sets it");
  }
  return static_cast<int>(total);
}

// Whether every '[' of a node list is closed by a ']' before the next '[' ("nid[001-004],gpu[1,3]").
bool brackets_pair_up(std::string_view nodelist) {
  bool open = false;
  for (char c : nodelist) {
    if (c == '[' || c == ']') {
      if (open == (c == '[')) return false;
      open = c == '[';
    }
  }
  return !open;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& nodelist) {
  if (nodelist.find_first_of("[,") == std::string::npos) return {nodelist};
  const char* hint = "check SLURM_JOB_NODELIST (Slurm sets it inside a job) and that scontrol is on PATH there";
  if (!brackets_pair_up(nodelist))
    throw Error(fmt::format("cannot expand the Slurm node list {}: a '[' without its ']' or the other way round", nodelist), hint);
  CommandResult r = run_command({"scontrol", "show", "hostnames", nodelist});
  std::vector<std::string> hosts;
  std::stringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) hosts.push_back(line);
  // scontrol 22.05 exits with 0 after "Invalid hostlist", having printed no name.
  if (!r.ok() || hosts.empty() || r.err.find("Invalid hostlist") != std::string::npos) {
    std::string said;  // scontrol's lines, on one line
    std::stringstream err_lines(r.err);
    for (std::string line; std::getline(err_lines, line);)
      if (!line.empty()) said += (said.empty() ? "" : "; ") + line;
    throw Error(fmt::format("cannot expand the Slurm node list {}: {}", nodelist, said.empty() ? "scontrol failed" : said), hint);
  }
  return hosts;
}

int gpus_per_node(const Environment& env) {
  if (auto on_node = lookup(env, "SLURM_GPUS_ON_NODE")) return slurm_count("SLURM_GPUS_ON_NODE", *on_node);
  if (auto per_node = lookup(env, "SLURM_GPUS_PER_NODE")) return count_in_gpu_spec(*per_node);
  if (auto job_gpus = lookup(env, "SLURM_JOB_GPUS")) return gpus_listed(*job_gpus);
  return 0;
}

int cpus_per_node(const Environment& env) {
  if (auto on_node = lookup(env, "SLURM_CPUS_ON_NODE")) return std::max(1, slurm_count("SLURM_CPUS_ON_NODE", *on_node));
  if (auto per_node = lookup(env, "SLURM_JOB_CPUS_PER_NODE"))  // "64(x2),32": the first node's
    return std::max(1, slurm_count("SLURM_JOB_CPUS_PER_NODE", *per_node, "(,"));
  return 1;
}

std::vector<int> tasks_per_node(const Environment& env, int num_nodes) {
  std::vector<int> counts;
  if (auto spec = lookup(env, "SLURM_TASKS_PER_NODE")) {
    static const std::regex entry(R"((\d{1,7})(?:\(x(\d{1,7})\))?)");
    std::stringstream parts(*spec);
    for (std::string part; std::getline(parts, part, ',');) {
      std::smatch m;
      if (!std::regex_match(part, m, entry) || std::stoi(m[1]) < 1) return {};
      const int repeat = m[2].matched ? std::stoi(m[2]) : 1;
      if (counts.size() + static_cast<size_t>(repeat) > 1'000'000) return {};
      counts.insert(counts.end(), static_cast<size_t>(repeat), std::stoi(m[1]));
    }
    return counts;
  }
  if (auto per_node = lookup(env, "SLURM_NTASKS_PER_NODE")) {
    const int count = slurm_count("SLURM_NTASKS_PER_NODE", *per_node);
    if (count > 0) counts.assign(static_cast<size_t>(std::max(num_nodes, 1)), count);
  }
  return counts;
}

bool srun_offers_pmix() {
  CommandResult r = run_command({"srun", "--mpi=list"}, std::chrono::seconds(10));
  return r.ok() && (r.out + r.err).find("pmix") != std::string::npos;
}

std::vector<std::string> srun_command(const TaskLayout& layout, const std::string& mpi_plugin) {
  std::vector<std::string> argv = {"srun", fmt::format("--nodes={}", layout.num_nodes),
                                   fmt::format("--ntasks={}", layout.num_nodes * layout.tasks_per_node),
                                   fmt::format("--ntasks-per-node={}", layout.tasks_per_node),
                                   fmt::format("--cpus-per-task={}", layout.cpus_per_task), "--kill-on-bad-exit=1",
                                   // Tasks need ddl run's variables even when the job was submitted
                                   // with --export=NONE (SLURM_EXPORT_ENV is inherited by srun).
                                   "--export=ALL", "--label",
                                   // Ranks node by node, as ddl's plan numbers them.
                                   "--distribution=block"};
  if (!mpi_plugin.empty()) argv.push_back("--mpi=" + mpi_plugin);
  if (!layout.hosts.empty()) argv.push_back(fmt::format("--nodelist={}", fmt::join(layout.hosts, ",")));
  argv.insert(argv.end(), layout.task_command.begin(), layout.task_command.end());
  return argv;
}

namespace {

// srun says how a task ended in strsignal()'s words ("Killed", "Segmentation fault (core dumped)").
int signal_named(const std::string& how) {
  const std::string name = how.substr(0, how.find(" (core dumped)"));
  for (int sig = 1; sig < NSIG; ++sig)
    if (const char* s = ::strsignal(sig); s != nullptr && name == s) return sig;
  return 0;
}

}  // namespace

std::optional<FailedTask> failed_task(const std::deque<std::string>& srun_stderr) {
  // srun's reports are short: longer lines are not read, and the numbers are bounded, since
  // std::regex recurses once per character it matches (a 40,000-character line would be a segfault).
  constexpr size_t kLongestReport = 4096;
  static const std::regex report(R"(^srun: error: ([^:\s]+): tasks? (\d{1,9})(?![0-9])[^:]*: (.*)$)");
  static const std::regex exited(R"(^Exited with exit code (\d{1,9})$)");
  for (const auto& line : srun_stderr) {
    std::smatch m, code;
    if (line.size() > kLongestReport || !std::regex_match(line, m, report)) continue;
    FailedTask task{std::stoi(m[2]), m[1], m[3]};
    if (std::regex_match(task.how, code, exited)) {
      task.exit_code = std::stoi(code[1]);
    } else if ((task.signal = signal_named(task.how)) != 0) {
      task.exit_code = 128 + task.signal;
    } else {
      continue;  // not a task's end
    }
    return task;
  }
  return std::nullopt;
}

std::optional<std::string> step_of_srun(const std::string& scontrol_steps, long srun_pid, const std::string& host) {
  const std::string pid_end = fmt::format(":{}", srun_pid);
  std::vector<std::string> found;  // steps of an srun of that pid on another host
  std::istringstream lines(scontrol_steps);
  for (std::string line; std::getline(lines, line);) {
    std::string step, srun_host;
    std::istringstream fields(line);
    for (std::string field; fields >> field;) {
      if (field.starts_with("StepId=")) step = field.substr(7);
      constexpr std::string_view kSrun = "SrunHost:Pid=";
      if (field.starts_with(kSrun) && field.ends_with(pid_end))
        srun_host = field.substr(kSrun.size(), field.size() - kSrun.size() - pid_end.size());
    }
    if (step.empty() || srun_host.empty()) continue;
    if (srun_host == host) return step;
    found.push_back(step);
  }
  if (found.size() == 1) return found.front();  // Slurm names this host otherwise (an alias): the one step of that pid
  return std::nullopt;
}

namespace {
// How long scontrol and scancel may take: they run while ddl run stops the workers.
constexpr auto kSlurmAnswerWait = std::chrono::seconds(5);
}  // namespace

std::optional<std::string> srun_step(const std::string& job_id, long srun_pid, const std::string& host) {
  if (job_id.empty()) return std::nullopt;
  const CommandResult steps = run_command({"scontrol", "-o", "show", "step", job_id}, kSlurmAnswerWait);
  if (!steps.ok()) return std::nullopt;
  return step_of_srun(steps.out, srun_pid, host.substr(0, host.find('.')));  // Slurm's SrunHost is the short name
}

bool signal_step(const std::string& step, int sig) {
  return run_command({"scancel", fmt::format("--signal={}", sig), step}, kSlurmAnswerWait).ok();
}

}  // namespace ddl::backends::slurm
