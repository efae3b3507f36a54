#include "backends/jobs.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/command.hpp"
#include "backends/job_script.hpp"
#include "backends/slurm/slurm_jobs.hpp"
#include "common/error.hpp"

namespace ddl::backends {

namespace {

std::string tool_error(const CommandResult& r) {
  std::string said = first_line(r.err.empty() ? r.out : r.err);
  return said.empty() ? fmt::format("exit status {}", r.exit_code) : said;
}

bool slurm_state_is_final(const std::string& state) {
  static const char* const kFinal[] = {"COMPLETED",     "FAILED",    "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                       "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"};
  for (const char* f : kFinal)
    if (state == f) return true;
  return false;
}

// squeue's answer; one that only says the job is unknown is not an error.
CommandResult run_squeue(const std::vector<std::string>& argv) {
  CommandResult r = run_command(argv);
  if (!r.ok() && (r.err + r.out).find("Invalid job id") == std::string::npos)
    throw Error("squeue failed: " + tool_error(r), "check that Slurm's tools work here (sinfo)");
  return r;
}

// The file job `facts` writes its output to; "" when it is not one file (array tasks not yet started).
std::string slurm_output_file(const slurm::JobFacts& facts) {
  auto query = slurm::one_field_query(facts, "STDOUT");
  if (!query) return "";
  const std::string pattern = slurm::read_one_field(run_squeue(*query).out);
  std::string name;
  if (slurm::pattern_names_job(pattern)) name = slurm::read_one_field(run_squeue(*slurm::one_field_query(facts, "Name")).out);
  return slurm::batch_output_file(pattern, facts, name);
}

std::optional<JobState> slurm_job_state(const std::string& id) {
  CommandResult r = run_squeue(slurm::facts_query(id));
  auto facts = r.ok() ? slurm::read_facts(r.out) : std::nullopt;
  if (!facts) return std::nullopt;  // Slurm does not know the job (any more)
  JobState s;
  s.id = facts->job_id;
  s.state = facts->state;
  s.reason = facts->reason == "None" ? "" : facts->reason;
  s.nodes = facts->nodes == "(null)" ? "" : facts->nodes;
  s.output = slurm_output_file(*facts);
  s.finished = slurm_state_is_final(s.state);
  if (s.finished) s.exit_code = slurm::exit_status(facts->exit_code);
  return s;
}

std::optional<JobState> pbs_job_state(const std::string& id) {
  CommandResult r = run_command({"qstat", "-x", "-f", "-F", "json", id});
  if (!r.ok()) {
    if ((r.err + r.out).find("Unknown Job Id") != std::string::npos) return std::nullopt;
    throw Error(fmt::format("qstat -f {} failed: {}", id, tool_error(r)), "check that PBS's tools work here (qstat -B)");
  }
  std::vector<JobState> jobs = pbs_jobs_from_qstat_json(r.out);
  if (jobs.empty()) throw Error(fmt::format("qstat -f -F json {} printed no job", id), "check the job id");
  return jobs.front();
}

// A field of qstat's JSON as text: a string as it is, a number as its digits, anything else "".
std::string qstat_text(const nlohmann::json& job, const char* field) {
  if (!job.contains(field)) return {};
  const nlohmann::json& value = job[field];
  if (value.is_string()) return value.get<std::string>();
  return value.is_number() ? value.dump() : std::string();
}

// PBS's Exit_status as a process exit status: 0-255 as it is, 256 + signal (a job killed by a
// signal) as 128 + signal; negative (a job PBS could not start) and anything else as 1.
int pbs_exit_code(const nlohmann::json& status) {
  if (!status.is_number_integer()) return 1;
  const auto code = status.get<long long>();  // a number past int's range is no code
  if (code >= 0 && code <= 255) return static_cast<int>(code);
  if (code > 256 && code < 256 + 128) return static_cast<int>(128 + (code - 256));
  return 1;
}

}  // namespace

bool scheduler_unreachable(const std::string& said) {
  // What sbatch and qsub print when they reach no controller or server (Slurm's errno string for
  // SLURM_COMMUNICATIONS_CONNECTION_ERROR; PBS's pbs_connect failure).
  // No slurm.conf and no DNS SRV record for the controller: Slurm finds no controller to ask.
  for (const char* sign : {"Unable to contact slurm controller", "cannot connect to server", "Could not establish a configuration source"})
    if (said.find(sign) != std::string::npos) return true;
  return false;
}

bool looks_like_job_id(const std::string& id) {
  // Longer is no job id, and std::regex would recurse once per character (a stack overflow).
  constexpr size_t kLongestJobId = 256;
  if (id.size() > kLongestJobId) return false;
  static const std::regex job_id(R"([0-9]+(_[0-9]+)?(\.[A-Za-z0-9_.-]+)?|[0-9]+\[[0-9]*\](\.[A-Za-z0-9_.-]+)?)");
  return std::regex_match(id, job_id);
}

std::vector<JobState> pbs_jobs_from_qstat_json(const std::string& qstat_json, const std::string& owner) {
  std::vector<JobState> jobs;
  auto doc = nlohmann::json::parse(qstat_json, nullptr, false);
  // Unreadable is an error, not "no jobs": OpenPBS leaves some characters of job variables unescaped
  // (a quote in one makes the whole document invalid), which must not pass for an empty queue.
  if (doc.is_discarded() || !doc.is_object() || (doc.contains("Jobs") && !doc["Jobs"].is_object()))
    throw Error("qstat -F json printed what is not qstat's JSON (OpenPBS leaves some characters of job variables unescaped)",
                "see the jobs with qstat, or ddl status ID for one job");
  if (!doc.contains("Jobs")) return jobs;  // no job at all
  for (const auto& [full_id, job] : doc["Jobs"].items()) {
    if (!job.is_object()) continue;
    const std::string job_owner = qstat_text(job, "Job_Owner");
    if (!owner.empty() && job_owner.substr(0, job_owner.find('@')) != owner) continue;
    JobState s;
    s.id = full_id;
    s.name = qstat_text(job, "Job_Name");
    s.state = qstat_text(job, "job_state");
    s.reason = qstat_text(job, "comment");
    s.nodes = qstat_text(job, "exec_host");
    s.output = qstat_text(job, "Output_Path");
    if (auto colon = s.output.find(':'); colon != std::string::npos) s.output = s.output.substr(colon + 1);  // host:path
    s.finished = s.state == "F" || s.state == "X";
    if (job.contains("Exit_status")) s.exit_code = pbs_exit_code(job["Exit_status"]);
    jobs.push_back(std::move(s));
  }
  return jobs;
}

std::string not_a_job_id(const std::string& id) {
  constexpr size_t kShown = 64;
  if (id.size() <= kShown) return fmt::format("'{}' is not a job id", id);
  return fmt::format("'{}...' ({} characters) is not a job id", id.substr(0, kShown), id.size());
}

Scheduler local_scheduler() {
  if (on_path("sbatch")) return Scheduler::Slurm;
  if (on_path("qsub")) return Scheduler::Pbs;
  throw Error("neither Slurm (sbatch) nor PBS (qsub) is on PATH here", "run ddl on the site's login node");
}

std::string submit_job(Scheduler scheduler, const std::string& script) {
  const bool slurm = scheduler == Scheduler::Slurm;
  std::vector<std::string> argv = slurm ? std::vector<std::string>{"sbatch", "--parsable"} : std::vector<std::string>{"qsub", "-"};
  // Generous: a submit that timed out here may still have been accepted, and a retry would
  // submit the job twice.
  CommandResult r = run_command(argv, std::chrono::seconds(300), script);
  if (r.timed_out)
    throw Error(fmt::format("{} did not answer within 300 s and was stopped; the job may be queued all the same", argv.front()),
                slurm ? "look for it with squeue --me before submitting again" : "look for it with qstat -u $USER before submitting again");
  if (r.exit_code < 0 && !r.timed_out)  // it could not be started: not on PATH
    throw Error(fmt::format("{}, so nothing was submitted", tool_error(r)),
                slurm ? "submit from a login node of the Slurm cluster (sbatch on PATH)"
                      : "submit from a login node of the PBS cluster (qsub on PATH), or choose a site that uses Slurm");
  if (!r.ok() && scheduler_unreachable(r.err + r.out))
    throw Error(
        fmt::format("{} could not reach the scheduler, so nothing was submitted: {}", argv.front(),
                    last_line(r.err.empty() ? r.out : r.err)),
        slurm ? "check that Slurm answers here (sinfo), then submit again" : "check that PBS answers here (qstat -B), then submit again");
  if (!r.ok()) throw Error(fmt::format("{} refused the job: {}", argv.front(), tool_error(r)), "fix what it names and submit again");
  std::string id = first_line(r.out);
  if (slurm) id = id.substr(0, id.find(';'));  // "123;cluster"
  if (!looks_like_job_id(id)) throw Error(fmt::format("{} printed no job id: {}", argv.front(), first_line(r.out + r.err)));
  return id;
}

std::optional<JobState> job_state(Scheduler scheduler, const std::string& id) {
  if (!looks_like_job_id(id)) throw UsageError(not_a_job_id(id), "give the number sbatch or qsub printed");
  return scheduler == Scheduler::Slurm ? slurm_job_state(id) : pbs_job_state(id);
}

std::vector<JobState> my_jobs(Scheduler scheduler) {
  std::vector<JobState> jobs;
  const std::string user = std::getenv("USER") ? std::getenv("USER") : std::to_string(::getuid());
  if (scheduler == Scheduler::Slurm) {
    // No job name: it may hold '|' and newlines, and no listing shows it. %r and %N rather than
    // %R, which is the one or the other, and puts a reason in parentheses.
    CommandResult r = run_command({"squeue", "-h", "-r", "-u", user, "-o", "%i|%T|%r|%N|"});
    if (!r.ok()) throw Error("squeue failed: " + tool_error(r), "check that Slurm's tools work here (sinfo)");
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> f;
      std::istringstream parts(line);
      for (std::string p; std::getline(parts, p, '|');) f.push_back(p);
      if (f.size() < 4) continue;
      JobState s{f[0], "", f[1], f[2] == "None" ? "" : f[2], f[3], "", std::nullopt, false};
      jobs.push_back(s);
    }
  } else {
    // -t: an array's subjobs too. Every user's jobs, kept by Job_Owner: OpenPBS's qstat refuses -u
    // beside -f or -F ("qstat: conflicting options.").
    CommandResult r = run_command({"qstat", "-t", "-f", "-F", "json"});
    if (!r.ok()) throw Error("qstat failed: " + tool_error(r), "check that PBS's tools work here (qstat -B)");
    for (JobState& s : pbs_jobs_from_qstat_json(r.out, user)) {  // the list shows what squeue's does
      s.output.clear();
      s.exit_code.reset();
      s.finished = false;
      jobs.push_back(std::move(s));
    }
  }
  return jobs;
}

namespace {

// One line of `squeue -r -O ArrayJobID,ArrayTaskID,State,Reason,NodeList,exit_code` (each ending
// in '|'): an element as "123_4"; nullopt for a line that is no array element.
std::optional<JobState> slurm_element(const std::string& line) {
  std::vector<std::string> f;
  for (size_t at = 0, bar = 0; (bar = line.find('|', at)) != std::string::npos; at = bar + 1) f.push_back(line.substr(at, bar - at));
  if (f.size() < 6 || f[1] == "N/A" || !looks_like_job_id(f[0] + "_" + f[1])) return std::nullopt;
  JobState e;
  e.id = f[0] + "_" + f[1];
  e.state = f[2];
  e.reason = f[3] == "None" ? "" : f[3];
  e.nodes = f[4] == "(null)" ? "" : f[4];
  e.finished = slurm_state_is_final(e.state);
  if (e.finished) e.exit_code = slurm::exit_status(f[5]);
  return e;
}

// Element ids sort by index ("123_10" after "123_9"), whatever squeue's or qstat's order.
uint64_t element_index(const std::string& id) {
  const size_t at = id.find_first_of("_[");
  uint64_t index = 0;
  for (size_t k = at == std::string::npos ? id.size() : at + 1;
       k < id.size() && std::isdigit(static_cast<unsigned char>(id[k])) && index < (uint64_t{1} << 60); ++k)
    index = index * 10 + static_cast<uint64_t>(id[k] - '0');
  return index;
}

}  // namespace

std::vector<JobState> array_elements(Scheduler scheduler, const std::string& id) {
  if (!looks_like_job_id(id)) throw UsageError(not_a_job_id(id), "give the number sbatch or qsub printed");
  std::vector<JobState> elements;
  if (scheduler == Scheduler::Slurm) {
    // One squeue for the whole array: -r, one line per element (pending ones too); -t all, ended
    // ones while Slurm still knows them (MinJobAge).
    CommandResult r = run_squeue(
        {"squeue", "-h", "-r", "-t", "all", "-j", id, "-O", "ArrayJobID:|,ArrayTaskID:|,State:|,Reason:|,NodeList:|,exit_code:|"});
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (auto e = slurm_element(line)) elements.push_back(std::move(*e));
  } else {
    // qsub names an array "123[].server"; -t lists its subjobs, -x those that ended too.
    CommandResult r = run_command({"qstat", "-t", "-x", "-f", "-F", "json", id});
    if (!r.ok() && (r.err + r.out).find("Unknown Job Id") == std::string::npos)
      throw Error(fmt::format("qstat -t -f {} failed: {}", id, tool_error(r)), "check that PBS's tools work here (qstat -B)");
    for (JobState& e : pbs_jobs_from_qstat_json(r.out))
      if (e.id.find("[]") == std::string::npos) elements.push_back(std::move(e));
  }
  std::sort(elements.begin(), elements.end(),
            [](const JobState& a, const JobState& b) { return element_index(a.id) < element_index(b.id); });
  return elements;
}

std::optional<std::vector<JobState>> follow_array(Scheduler scheduler, const std::string& id, std::chrono::seconds timeout,
                                                  const std::function<void(const JobState&)>& on_change) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::map<std::string, JobState> seen;  // every element ever listed, as last seen
  int empty_polls = 0;
  // One squeue or qstat per poll, every 2 s: an array of many elements costs the scheduler no more.
  for (;; std::this_thread::sleep_for(std::chrono::seconds(2))) {
    const std::vector<JobState> now = array_elements(scheduler, id);
    std::set<std::string> listed;
    for (const JobState& e : now) {
      auto it = seen.find(e.id);
      if (shows_change(it == seen.end() ? std::nullopt : std::optional<JobState>(it->second), e)) on_change(e);
      seen[e.id] = e;
      listed.insert(e.id);
    }
    // An element the scheduler no longer lists has ended (Slurm forgets ended jobs after MinJobAge)
    // with an end not seen: unknown.
    for (auto& [element, last] : seen)
      if (!listed.count(element) && !last.finished) {
        last.finished = true;
        last.state = "ENDED (no longer listed)";
        last.exit_code.reset();
      }
    empty_polls = now.empty() ? empty_polls + 1 : 0;
    // Every element seen has ended (those no longer listed too), or none was listed in a minute.
    const bool all_ended = !seen.empty() && std::all_of(seen.begin(), seen.end(), [](const auto& e) { return e.second.finished; });
    if (all_ended || empty_polls >= 30) break;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
  std::vector<JobState> ended;
  ended.reserve(seen.size());
  for (auto& [element, last] : seen) ended.push_back(last);
  std::sort(ended.begin(), ended.end(), [](const JobState& a, const JobState& b) { return element_index(a.id) < element_index(b.id); });
  return ended;
}

int ended_job_exit_code(const JobState& job) {
  const bool completed = job.state == "COMPLETED" || job.state == "F" || job.state == "X";  // Slurm's, PBS's finished (X: a subjob)
  const int code = job.exit_code.value_or(1);
  return code != 0 ? code : completed ? 0 : 1;
}

bool cancel_job(Scheduler scheduler, const std::string& id) {
  if (!looks_like_job_id(id)) throw UsageError(not_a_job_id(id), "give the number sbatch or qsub printed");
  // scancel exits with 0 for a job it does not know or that has ended, and says so only when verbose.
  std::vector<std::string> argv =
      scheduler == Scheduler::Slurm ? std::vector<std::string>{"scancel", "--verbose", id} : std::vector<std::string>{"qdel", id};
  CommandResult r = run_command(argv);
  const size_t error_at = r.err.find("scancel: error:");
  if (scheduler == Scheduler::Slurm && error_at != std::string::npos) {
    const std::string said = first_line(r.err.substr(error_at));
    if (said.find("already completing or completed") != std::string::npos) return false;
    throw Error(fmt::format("scancel {} failed: {}", id, said), "check the id with ddl status");
  }
  if (!r.ok()) throw Error(fmt::format("{} {} failed: {}", argv.front(), id, tool_error(r)), "check the id with ddl status");
  return true;
}

void requeue_slurm_job(const std::string& id) {
  if (!looks_like_job_id(id)) throw Error(not_a_job_id(id), "SLURM_JOB_ID should hold the job's number");
  CommandResult r = run_command({"scontrol", "requeue", id});
  if (!r.ok())
    throw Error(fmt::format("scontrol requeue {} failed: {}", id, tool_error(r)), "check that the job was submitted with --requeue");
}

std::optional<bool> slurm_job_is_batch(const std::string& id) {
  if (!looks_like_job_id(id)) return std::nullopt;
  // squeue's field, not scontrol's line (see slurm_jobs.hpp: a job's name may hold "BatchFlag=").
  const CommandResult r = run_command({"squeue", "-h", "-j", id, "-O", "BatchFlag:|"}, std::chrono::seconds(10));
  const std::string flag = first_line(r.out).substr(0, first_line(r.out).find('|'));
  if (!r.ok() || (flag != "0" && flag != "1")) return std::nullopt;
  return flag == "1";
}

std::optional<std::chrono::seconds> slurm_time_left(const std::string& id) {
  if (!looks_like_job_id(id)) return std::nullopt;
  // Asked while workers save (the supervisor waits meanwhile): a slow controller is not waited for.
  const CommandResult r = run_command({"squeue", "-h", "-j", id, "-o", "%L"}, std::chrono::seconds(5));
  static const std::regex time_left(R"((\d{1,5}-)?\d{1,6}(:\d{1,2}){1,2})");
  std::string left = r.out.substr(0, r.out.find('\n'));
  if (!r.ok() || !std::regex_match(left, time_left)) return std::nullopt;
  return std::chrono::seconds(time_limit_seconds(left));
}

bool shows_change(const std::optional<JobState>& before, const JobState& now) {
  return !before || now.state != before->state || now.reason != before->reason || now.nodes != before->nodes;
}

std::optional<JobState> follow_job(Scheduler scheduler, const std::string& id, std::chrono::seconds timeout,
                                   const std::function<void(const JobState&)>& on_change) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<JobState> last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto now = job_state(scheduler, id);
    if (!now) {
      if (last) last->vanished = true;
      return last;
    }
    if (shows_change(last, *now)) on_change(*now);
    last = now;
    if (now->finished) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return last;
}

}  // namespace ddl::backends
