#include "backends/job_script.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/bounded_regex.hpp"
#include "common/error.hpp"

namespace ddl::backends {

namespace {

// The options given, over the site's defaults.
std::map<std::string, std::string> over_defaults(const SiteProfile& site, const std::map<std::string, std::string>& options) {
  std::map<std::string, std::string> values = site.defaults;
  for (const auto& [key, value] : options) values[key] = value;
  return values;
}

// Every option's value: the user's, else the site's default, else one derived from the site.
std::map<std::string, std::string> effective_values(const SiteProfile& site, const JobRequest& job) {
  std::map<std::string, std::string> v = over_defaults(site, job.options);
  NodeShape shape{site.gpus_per_node, site.cores_per_node};
  if (auto p = v.find("partition"); p != v.end() && site.partitions.count(p->second)) shape = site.partitions.at(p->second);
  if (!v.count("nodes")) v["nodes"] = "1";
  if (!v.count("gpus_per_node")) v["gpus_per_node"] = std::to_string(shape.gpus_per_node);
  if (!v.count("job_name")) v["job_name"] = "ddl";
  const int gpus = std::stoi(v["gpus_per_node"]);
  const int tasks = std::max(1, gpus);
  v["tasks_per_node"] = std::to_string(tasks);
  // A site whose core count is unknown (0) gets no core request unless the user makes one. A job
  // with part of a node's GPUs gets that part of its cores: on shared nodes (Neuron's) a one-GPU
  // job holding all 64 cores of an 8-GPU node leaves the other seven GPUs without a core.
  if (!v.count("cpus_per_task") && shape.cores_per_node > 0) {
    const bool part_of_node = gpus > 0 && shape.gpus_per_node > gpus;
    const long long cores = part_of_node ? static_cast<long long>(shape.cores_per_node) * gpus / shape.gpus_per_node : shape.cores_per_node;
    v["cpus_per_task"] = std::to_string(std::max(1LL, cores / tasks));
  }
  // Up to 6 digits each (7 for a profile's GPUs): the product needs 64 bits.
  if (v.count("cpus_per_task")) v["cpus_per_node"] = std::to_string(static_cast<long long>(tasks) * std::stoi(v["cpus_per_task"]));
  return v;
}

NodeShape node_shape(const SiteProfile& site, const std::map<std::string, std::string>& values) {
  if (auto p = values.find("partition"); p != values.end() && site.partitions.count(p->second)) return site.partitions.at(p->second);
  return {site.gpus_per_node, site.cores_per_node};
}

}  // namespace

int partition_gpus(const SiteProfile& site, const std::map<std::string, std::string>& options) {
  return node_shape(site, over_defaults(site, options)).gpus_per_node;
}

namespace {

// libstdc++'s std::regex recurses once per character matched, so a long value overflows the stack:
// values and profile texts are scanned by hand, and a site's own patterns see at most
// kLongestValue characters.
constexpr size_t kLongestValue = 1024;
// What a site's pattern gets to match one value: microseconds are enough for any sane one.
constexpr std::chrono::milliseconds kPatternBudget{2000};

bool plain_word(std::string_view s, std::string_view extra) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || extra.find(c) != std::string_view::npos;
  });
}

struct Placeholder {
  size_t position, length;
  std::string key;
};

// Every {{key}} (key: a-z and _) in `text`, in order.
std::vector<Placeholder> placeholders(const std::string& text) {
  std::vector<Placeholder> found;
  for (size_t at = text.find("{{"); at != std::string::npos; at = text.find("{{", at + 1)) {
    size_t end = at + 2;
    while (end < text.size() && (std::islower(static_cast<unsigned char>(text[end])) || text[end] == '_')) ++end;
    if (end > at + 2 && text.compare(end, 2, "}}") == 0) {
      found.push_back({at, end + 2 - at, text.substr(at + 2, end - at - 2)});
      at = end + 1;
    }
  }
  return found;
}

// `shown`: how the error names the value's source (default: the option's flag).
void require_whole_number(const std::map<std::string, std::string>& values, const std::string& option, int minimum,
                          const std::string& shown = "") {
  auto it = values.find(option);
  if (it == values.end()) return;
  static const std::regex digits("[0-9]{1,6}");
  if (!std::regex_match(it->second, digits) || std::stoi(it->second) < minimum)
    throw UsageError(
        fmt::format("{} {}: must be a whole number from {} to 999999", shown.empty() ? flag_for(option) : shown, it->second, minimum),
        fmt::format("write it in digits alone, from {} to 999999", minimum));
}

// How an error names where `option`'s value came from: the flag the user gave, or the site
// profile's default (its field, and the file or built-in profile that set it).
std::string default_source(const SiteProfile& site, const std::string& option) {
  auto origin = site.origin.find("defaults." + option);
  const std::string where = origin == site.origin.end() || origin->second == "built-in"
                                ? fmt::format("the built-in site profile '{}'", site.name)
                                : origin->second;
  return fmt::format("{} (defaults.{} in {})", flag_for(option), option, where);
}

std::string value_source(const SiteProfile& site, const JobRequest& job, const std::string& option) {
  return job.options.count(option) || !site.defaults.count(option) ? flag_for(option) : default_source(site, option);
}

std::string directive_word(Scheduler scheduler, const std::string& option, const std::string& value);

// Replaces {{option}} with its value (as a directive word when `in_directive`); `what` names the
// text for the error when one is unset.
std::string fill(const std::string& text, const std::map<std::string, std::string>& values, const SiteProfile& site,
                 const std::string& what, bool in_directive = true) {
  std::string out;
  size_t last = 0;
  for (const Placeholder& p : placeholders(text)) {
    const std::string& key = p.key;
    auto value = values.find(key);
    if (value == values.end())
      throw UsageError(fmt::format("site '{}' needs {} for its {} '{}'", site.name, flag_for(key), what, text),
                       fmt::format("give {} (see `ddl sites show {}`)", flag_for(key), site.name));
    out.append(text, last, p.position - last).append(in_directive ? directive_word(site.scheduler, key, value->second) : value->second);
    last = p.position + p.length;
  }
  return out.append(text, last);
}

// A value as one word of an #SBATCH line. sbatch splits those lines at blanks and honours quotes,
// and reads a backslash as an escape everywhere, inside quotes too (so it would drop a lone one):
// in double quotes with `\` and `"` escaped, sbatch gets back exactly the value. No shell reads
// the line, so $( ) and backticks are inert text there anyway.
std::string slurm_directive_word(const std::string& value) {
  if (plain_word(value, "_./:=@%+,&-")) return value;
  std::string word = "\"";
  for (char c : value) {
    if (c == '\\' || c == '"') word += '\\';
    word += c;
  }
  return word + "\"";
}

// A value as one word of a #PBS line. qsub splits those lines at blanks and honours quotes, but
// PBS flavours disagree on a backslash (OpenPBS keeps it inside quotes and escapes with it outside
// them; a line ending in one continues on the next), so a value holding one is refused rather
// than risk a changed value.
std::string pbs_directive_word(const std::string& option, const std::string& value) {
  if (value.find('\\') != std::string::npos)
    throw UsageError(fmt::format("{} contains a backslash, which qsub does not read the same way on every PBS", flag_for(option)),
                     "remove the backslash from it");
  if (plain_word(value, "_./:=@%+,&-")) return value;
  if (value.find('"') == std::string::npos) return "\"" + value + "\"";
  if (value.find('\'') == std::string::npos) return "'" + value + "'";
  throw UsageError(fmt::format("{} holds both kinds of quote, which a #PBS directive cannot carry", flag_for(option)),
                   "drop one kind of quote from it");
}

std::string directive_word(Scheduler scheduler, const std::string& option, const std::string& value) {
  return scheduler == Scheduler::Slurm ? slurm_directive_word(value) : pbs_directive_word(option, value);
}

// The options a site's script has a place for: its scheduler's own directives, the `ddl run` line,
// and every {{option}} its profile's texts name.
std::set<std::string> usable_options(const SiteProfile& site) {
  std::set<std::string> usable;
  for (const BatchOption& option : batch_options())
    if (option.place == ScriptPlace::Always || (option.place == ScriptPlace::SlurmOnly && site.scheduler == Scheduler::Slurm))
      usable.emplace(option.key);
  std::vector<std::string> texts = site.directives;
  texts.push_back(site.gpu_request);
  if (site.container) {
    usable.insert("image");
    texts.push_back(site.container->image_directive);
    texts.insert(texts.end(), site.container->wrap.begin(), site.container->wrap.end());
  }
  for (const auto& text : texts)
    for (const Placeholder& p : placeholders(text)) usable.insert(p.key);
  return usable;
}

// A value that begins a word of the container command in the `ddl run` line ("{{image}}" in
// `singularity exec --nv {{image}}`) is read as an option there when it starts with '-'
// (--image=--bind=/:/host would mount the whole host), so it is refused.
void refuse_option_like_words(const SiteProfile& site, const std::map<std::string, std::string>& values) {
  if (!site.container || !values.count("image")) return;  // the wrap is used with an image only
  for (const auto& word : site.container->wrap)
    for (const Placeholder& p : placeholders(word)) {
      auto value = values.find(p.key);
      if (p.position == 0 && value != values.end() && value->second.starts_with('-'))
        throw UsageError(fmt::format("{} {}: starts with '-', so the container command ({}) would read it as an option", flag_for(p.key),
                                     value->second, site.container->wrap.front()),
                         fmt::format("give {} a value that does not start with '-' (a file as ./NAME)", flag_for(p.key)));
    }
}

// What an array's form allows but the scheduler refuses: a range that ends before it starts, a step
// of 0, a limit of 0 elements at once.
void check_array_numbers(const std::string& spec) {
  const size_t percent = spec.find('%');
  if (percent != std::string::npos && std::stol(spec.substr(percent + 1)) == 0)
    throw UsageError(fmt::format("--array '{}': a limit of 0 elements at once would run none", spec), "give %1 or more, or no limit");
  static const std::regex range(R"((\d+)-(\d+)(:(\d+))?)");
  std::istringstream elements(spec.substr(0, percent));
  std::smatch m;
  for (std::string element; std::getline(elements, element, ',');) {
    if (!std::regex_match(element, m, range)) continue;
    if (std::stol(m[2].str()) < std::stol(m[1].str()))
      throw UsageError(fmt::format("--array '{}': the range {} ends before it starts", spec, element),
                       fmt::format("write it {}-{}", m[2].str(), m[1].str()));
    if (m[4].matched && std::stol(m[4].str()) == 0)
      throw UsageError(fmt::format("--array '{}': the range {} has a step of 0", spec, element), "give a step of 1 or more");
  }
}

// Slurm: a list of indices and ranges with steps, at most N at once ("0-15%4", "1,3,5-9:2");
// PBS: one range (-J 0-15[:step][%N]), which PBS wants of two elements at least.
void check_array(const SiteProfile& site, const std::string& spec) {
  static const std::regex slurm(R"((\d{1,7}(-\d{1,7}(:\d{1,7})?)?)(,\d{1,7}(-\d{1,7}(:\d{1,7})?)?){0,63}(%\d{1,7})?)");
  static const std::regex pbs(R"((\d{1,7})-(\d{1,7})(:\d{1,7})?(%\d{1,7})?)");
  std::smatch m;
  if (site.scheduler == Scheduler::Slurm) {
    if (spec.size() > 1024 || !std::regex_match(spec, slurm))
      throw UsageError(fmt::format("--array '{}' is not a Slurm array", spec.substr(0, 64)),
                       "give indices and ranges with an optional step and limit, e.g. --array 0-15%4 or --array 1,3,5-9:2");
    check_array_numbers(spec);
    return;
  }
  if (!std::regex_match(spec, m, pbs))
    throw UsageError(fmt::format("--array '{}': site '{}' uses PBS, whose arrays are one range (-J START-END[:STEP][%N])",
                                 spec.substr(0, 64), site.name),
                     "give a range, e.g. --array 0-15%4");
  if (std::stol(m[2].str()) <= std::stol(m[1].str()))
    throw UsageError(fmt::format("--array '{}': a PBS array needs an end above its start", spec), "e.g. --array 0-15");
  check_array_numbers(spec);
}

// Slurm: host names and node ranges. PBS has no way to keep a job off named nodes (a select names
// the hosts it wants, never the ones it does not), so there it is refused.
void check_exclude(const SiteProfile& site, const std::string& hosts) {
  if (site.scheduler != Scheduler::Slurm)
    throw UsageError(fmt::format("--exclude: site '{}' uses PBS, which cannot keep a job off named nodes", site.name),
                     "ask for the nodes you need and leave bad ones out inside the job: --exclude on the script's ddl run line "
                     "(with a spare node), or ask the site to take the node offline");
  // Slurm reads a value with '/' as a file of node names (a site's list of bad nodes).
  if (hosts.find('/') != std::string::npos) {
    if (hosts.find('\n') != std::string::npos || ::access(hosts.c_str(), R_OK) != 0)
      throw UsageError(fmt::format("--exclude {}: Slurm reads a value with '/' as a file of node names, and this is not a readable file",
                                   hosts.substr(0, 256)),
                       "give the file's path, or the nodes: --exclude nid001234,nid[002000-002003]");
    return;
  }
  if (hosts.size() > 65536)
    throw UsageError(fmt::format("--exclude: a list of {} characters is too long for a directive", hosts.size()),
                     "put the nodes in a file, one per line, and give its path: --exclude ./bad-nodes");
  // The characters of host names and node ranges; Slurm itself reads the list when the job is submitted.
  const auto host_list_character = [](unsigned char c) { return std::isalnum(c) || std::strchr("._-,[]", c) != nullptr; };
  if (hosts.empty() || hosts.front() == ',' || hosts.back() == ',' || hosts.find(",,") != std::string::npos ||
      !std::all_of(hosts.begin(), hosts.end(), host_list_character))
    throw UsageError(fmt::format("--exclude '{}' is not a Slurm node list", hosts.substr(0, 64)),
                     "give host names or node ranges separated by commas, e.g. --exclude nid001234,nid[002000-002003]");
}

std::string directive_prefix(const SiteProfile& site) { return site.scheduler == Scheduler::Slurm ? "#SBATCH " : "#PBS "; }

void slurm_directives(const SiteProfile& site, const std::map<std::string, std::string>& v, const JobRequest& job,
                      std::vector<std::string>& d) {
  for (const BatchOption& option : batch_options()) {
    if (option.key == "gpus_per_node") {  // one task per GPU, and the GPUs as the site asks for them
      d.push_back("--ntasks-per-node=" + v.at("tasks_per_node"));
      if (std::stoi(v.at("gpus_per_node")) > 0 && !site.gpu_request.empty()) d.push_back(fill(site.gpu_request, v, site, "GPU request"));
    }
    auto it = v.find(std::string(option.key));
    if (!option.slurm.empty() && it != v.end() && !it->second.empty())
      d.push_back(fmt::format("--{}={}", option.slurm, slurm_directive_word(it->second)));
  }
  if (job.signal_before_seconds || job.requeue) {
    // To the batch shell alone, which is `ddl run` (the script ends in exec): it passes the signal on
    // to every worker, on every node, and with --requeue-signal requeues the job once they ended.
    d.push_back(fmt::format("--signal=B:{}@{}", job.signal.value_or("USR1"), job.signal_before_seconds.value_or(kRequeueSignalBefore)));
  }
  if (job.requeue) {
    d.emplace_back("--requeue");
    d.emplace_back("--open-mode=append");  // each start's output goes on in the same file
  }
  if (job.array) d.push_back("--array=" + *job.array);
  if (job.exclude)  // a node list as it is (check_exclude allows no character a directive would need quoted), a file as a word
    d.push_back("--exclude=" + (job.exclude->find('/') != std::string::npos ? slurm_directive_word(*job.exclude) : *job.exclude));
}

// Slurm's time forms as PBS's HH:MM:SS: PBS reads a bare "30" as seconds and refuses days.
std::string pbs_walltime(const std::string& slurm_time) {
  const long seconds = time_limit_seconds(slurm_time);
  return fmt::format("{:02}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
}

bool asks_for_placement(const SiteProfile& site, const JobRequest& job) {
  auto places = [](const std::string& text) { return text.find("place=") != std::string::npos; };
  return places(site.gpu_request) || std::any_of(site.directives.begin(), site.directives.end(), places) ||
         std::any_of(job.extra_directives.begin(), job.extra_directives.end(), places);
}

void pbs_directives(const SiteProfile& site, const std::map<std::string, std::string>& v, const JobRequest& job,
                    std::vector<std::string>& d) {
  for (const BatchOption& option : batch_options()) {
    if (option.key == "gpus_per_node" && !site.gpu_request.empty())
      d.push_back("-l " + fill(site.gpu_request, v, site, "select statement"));
    auto it = v.find(std::string(option.key));
    if (it == v.end()) continue;
    if (option.key == "time")
      d.push_back("-l walltime=" + pbs_walltime(it->second));
    else if (!option.pbs.empty())
      d.push_back(fmt::format("{}{}", option.pbs, pbs_directive_word(it->first, it->second)));
  }
  // Without a place, OpenPBS places the chunks freely, so two of the N nodes' chunks may share a
  // host and `ddl run -N` finds fewer nodes than it was given.
  if (std::stoi(v.at("nodes")) > 1 && !asks_for_placement(site, job)) d.emplace_back("-l place=scatter");
  d.emplace_back("-j oe");                  // one output file, as Slurm writes
  if (job.requeue) d.emplace_back("-r y");  // rerunnable: a preempted job (Polaris' preemptable queue) runs again
  if (job.array) d.push_back("-J " + *job.array);
}

std::string ddl_run_line(const SiteProfile& site, const std::map<std::string, std::string>& v, const JobRequest& job) {
  std::vector<std::string> words = {job.ddl_program, "run", "-N", v.at("nodes")};
  const int gpus = std::stoi(v.at("gpus_per_node"));
  if (gpus > 0)
    words.insert(words.end(), {"--gpus-per-node", std::to_string(gpus)});
  else
    words.insert(words.end(), {"--cpu", "--nproc-per-node", "1"});
  if (v.count("cpus_per_task")) words.insert(words.end(), {"--cpus-per-task", v.at("cpus_per_task")});
  words.insert(words.end(), {"--launcher", site.launcher});
  if (site.gpu_order == "reverse") words.insert(words.end(), {"--gpu-order", "reverse"});
  if (site.hang_timeout > 0) words.insert(words.end(), {"--hang-timeout", std::to_string(site.hang_timeout)});
  if (job.requeue && site.scheduler == Scheduler::Slurm) {
    words.insert(words.end(), {"--requeue-signal", job.signal.value_or("USR1")});
    if (job.max_requeues) words.insert(words.end(), {"--max-requeues", std::to_string(*job.max_requeues)});
  }
  words.emplace_back("--");
  if (site.container && v.count("image"))
    for (const auto& w : site.container->wrap) words.push_back(fill(w, v, site, "container command", false));
  words.insert(words.end(), job.command.begin(), job.command.end());
  std::string line = "exec";
  for (const auto& w : words) line += " " + shell_quote(w);
  return line;
}

}  // namespace

long time_limit_seconds(const std::string& slurm_time) {
  int days = 0;
  std::string rest = slurm_time;
  if (auto dash = rest.find('-'); dash != std::string::npos) {
    days = std::stoi(rest.substr(0, dash));
    rest = rest.substr(dash + 1);
  }
  std::vector<int> parts;
  for (size_t at = 0; at <= rest.size();) {
    size_t colon = rest.find(':', at);
    parts.push_back(std::stoi(rest.substr(at, colon == std::string::npos ? std::string::npos : colon - at)));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  long seconds = 0;
  if (slurm_time.find('-') != std::string::npos) {  // D-H, D-H:M, D-H:M:S
    const int factors[] = {3600, 60, 1};
    for (size_t i = 0; i < parts.size() && i < 3; ++i) seconds += static_cast<long>(parts[i]) * factors[i];
  } else if (parts.size() == 1) {  // minutes
    seconds = parts[0] * 60L;
  } else if (parts.size() == 2) {  // minutes:seconds
    seconds = parts[0] * 60L + parts[1];
  } else {
    seconds = parts[0] * 3600L + parts[1] * 60L + parts[2];
  }
  return seconds + days * 86400L;
}

std::string shell_quote(std::string_view s) {
  if (plain_word(s, "_./:=@%+,-")) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else if (c == '\r')  // sbatch and qsub refuse a script with CR LF in it ("DOS line breaks")
      out += "'$'\\r''";
    else
      out += c;
  }
  return out + "'";
}

namespace {

// A job outside its queue's node range or time limit, where the profile knows them, is refused by
// qsub (or waits in a Slurm QOS for ever): the error names the queues that would take it.
void check_queue_limits(const SiteProfile& site, const JobRequest& job, const std::map<std::string, std::string>& v) {
  const auto queue = v.find("queue");
  if (queue == v.end() || !site.queues.count(queue->second)) return;
  const int nodes = std::stoi(v.at("nodes"));
  const auto time = v.find("time");
  // Slurm reads a time of 0 as no limit; no -t at all is the queue's own default, within its limit.
  const long seconds = time == v.end() ? 0 : time_limit_seconds(time->second);
  const bool unlimited = time != v.end() && seconds == 0;
  const auto takes = [&](const QueueLimits& q) {
    const bool nodes_fit = nodes >= q.min_nodes && (q.max_nodes == 0 || nodes <= q.max_nodes);
    return nodes_fit && (q.max_time.empty() || (!unlimited && seconds <= time_limit_seconds(q.max_time)));
  };
  const QueueLimits& limits = site.queues.at(queue->second);
  if (takes(limits)) return;
  std::vector<std::string> others;
  for (const auto& [name, q] : site.queues)
    if (takes(q)) others.push_back("-q " + name);
  const std::string range = limits.max_nodes == 0                  ? fmt::format("{} or more nodes", limits.min_nodes)
                            : limits.min_nodes == limits.max_nodes ? fmt::format("{} node(s)", limits.min_nodes)
                                                                   : fmt::format("{} to {} nodes", limits.min_nodes, limits.max_nodes);
  const std::string asked = time == v.end() ? fmt::format("{} nodes", nodes) : fmt::format("{} nodes for {}", nodes, time->second);
  throw UsageError(
      fmt::format("{} {}: site '{}' queue {} takes {}{}; this job asks for {}", value_source(site, job, "queue"), queue->second, site.name,
                  queue->second, range, limits.max_time.empty() ? "" : " for at most " + limits.max_time, asked),
      others.empty() ? fmt::format("no queue of site '{}' takes {}: change -N or -t", site.name, asked)
                     : fmt::format("use {} (the queues that take {}), or change -N or -t", fmt::join(others, " or "), asked));
}

// A lead as long as the time limit signals the job as it starts (and Slurm may signal up to a minute
// earlier still): with --requeue it saves, ends and is requeued over and over without progress.
void check_signal_lead(const SiteProfile& site, const JobRequest& job, const std::map<std::string, std::string>& v) {
  if (site.scheduler != Scheduler::Slurm || !(job.signal_before_seconds || job.requeue)) return;
  auto t = v.find("time");
  if (t == v.end()) return;  // the partition's default limit, which the script cannot know
  const long limit = time_limit_seconds(t->second);
  const std::string asked = job.signal_before_seconds ? "--signal-before" : "--requeue";
  if (limit == 0)
    throw UsageError(fmt::format("{} with {} {}: Slurm reads 0 as no time limit, so the signal before it never comes", asked,
                                 value_source(site, job, "time"), t->second),
                     "give -t the job's time limit");
  const long lead = job.signal_before_seconds.value_or(kRequeueSignalBefore);
  if (lead >= limit)
    throw UsageError(fmt::format("{} signals {} s before the time limit, and {} {} is {} s: the job would be told to stop as it starts",
                                 job.signal_before_seconds ? fmt::format("--signal-before {}", lead) : "--requeue", lead,
                                 value_source(site, job, "time"), t->second, limit),
                     "give a -t longer than the lead (Slurm may signal up to a minute early), or a smaller --signal-before");
}

// qsub's rule for -N (OpenPBS check_job_name): letters, digits and - _ + . only, at most 230.
void check_pbs_job_name(const SiteProfile& site, const JobRequest& job, const std::map<std::string, std::string>& v) {
  auto name = v.find("job_name");
  if (site.scheduler != Scheduler::Pbs || name == v.end()) return;
  constexpr size_t kLongestPbsJobName = 230;
  const bool allowed = std::all_of(name->second.begin(), name->second.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '+' || c == '.';
  });
  if (!allowed || name->second.empty() || name->second.size() > kLongestPbsJobName)
    throw UsageError(fmt::format("{} '{}': PBS takes a job name of letters, digits and - _ + . only, at most {} of them",
                                 value_source(site, job, "job_name"), name->second, kLongestPbsJobName),
                     "give a name such as resnet50_run2");
}

}  // namespace

void check_site_rules(const SiteProfile& site, const JobRequest& job) {
  // Directive values are read by sbatch/qsub, not a shell: a newline would start a new directive.
  for (const auto& [option, value] : job.options)
    if (value.size() > kLongestValue)
      throw UsageError(fmt::format("{} is {} characters long; a batch directive value may have at most {}", flag_for(option), value.size(),
                                   kLongestValue),
                       "shorten it");
  for (const auto& [option, value] : job.options)
    if (std::any_of(value.begin(), value.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
      throw UsageError(fmt::format("{} contains a newline or control character", flag_for(option)),
                       "batch directives are one line each; remove it");
  for (const auto& directive : job.extra_directives)
    if (directive.find_first_of("\n\r") != std::string::npos || directive.empty())
      throw UsageError("--directive must be one non-empty line", "give each directive with its own --directive");
  const std::set<std::string> usable = usable_options(site);
  for (const auto& [option, value] : job.options)
    if (!usable.count(option) && !site.forbidden.count(option))
      throw UsageError(
          fmt::format("{}: site '{}' ({}) has no place for it in its script", flag_for(option), site.name, scheduler_key(site.scheduler)),
          fmt::format("drop {}, or name it in the profile (see `ddl sites show {}`)", flag_for(option), site.name));
  for (const auto& [option, why] : site.forbidden)
    if (job.options.count(option))
      throw UsageError(fmt::format("site '{}' does not allow {}: {}", site.name, flag_for(option), why),
                       fmt::format("drop {}", flag_for(option)));

  // Whole numbers first: the derived values below compute with them.
  require_whole_number(job.options, "nodes", 1);
  require_whole_number(job.options, "gpus_per_node", 0);
  require_whole_number(job.options, "cpus_per_task", 1);
  require_whole_number(site.defaults, "cpus_per_task", 1, default_source(site, "cpus_per_task"));
  const auto v = effective_values(site, job);
  for (const auto& [option, value] : v)  // profile defaults too
    if (value.size() > kLongestValue)
      throw UsageError(fmt::format("{} is {} characters long; a batch directive value may have at most {}", value_source(site, job, option),
                                   value.size(), kLongestValue),
                       "shorten it");
  for (const auto& option : site.required)
    if (!v.count(option) || v.at(option).empty())
      throw UsageError(fmt::format("site '{}' requires {}", site.name, flag_for(option)),
                       site.patterns.count(option) && !site.patterns.at(option).fix.empty() ? site.patterns.at(option).fix
                                                                                            : fmt::format("give {}", flag_for(option)));
  for (const auto& [option, rule] : site.patterns) {
    auto it = v.find(option);
    if (it == v.end()) continue;
    const RegexMatch match = match_whole_within(it->second, rule.regex, kPatternBudget);
    if (match == RegexMatch::too_slow)
      throw UsageError(fmt::format("site '{}': patterns.{}.regex took over {} s to match {} ({} characters): a pattern of nested "
                                   "repetition, such as (a|aa)*, backtracks for ever",
                                   site.name, option, kPatternBudget.count() / 1000, value_source(site, job, option), it->second.size()),
                       "write the pattern without a repeated group that can match the same text two ways");
    if (match == RegexMatch::no)
      throw UsageError(fmt::format("{} {}: {}", value_source(site, job, option), it->second,
                                   rule.why.empty() ? "does not match " + rule.regex : rule.why),
                       !rule.fix.empty() ? rule.fix : fmt::format("give a value that matches {}", rule.regex));
  }
  if (auto t = v.find("time"); t != v.end() && !is_time_limit(t->second))
    throw UsageError(fmt::format("{} {}: not a time limit", value_source(site, job, "time"), t->second),
                     "write it as HH:MM:SS, MM or D-HH:MM:SS");
  // Slurm reads a zero time limit as "no limit"; PBS has no such request, and walltime=00:00:00
  // would ask for a job that may run no time at all.
  if (auto t = v.find("time"); t != v.end() && site.scheduler == Scheduler::Pbs && time_limit_seconds(t->second) == 0)
    throw UsageError(
        fmt::format("{} {}: PBS has no \"no time limit\" (Slurm's meaning of 0) to ask for", value_source(site, job, "time"), t->second),
        "give the walltime the job needs, e.g. -t 02:00:00, or leave -t out for the queue's default");
  refuse_option_like_words(site, v);
  check_queue_limits(site, job, v);
  check_signal_lead(site, job, v);
  check_pbs_job_name(site, job, v);
  const NodeShape shape = node_shape(site, v);
  const int gpus = std::stoi(v.at("gpus_per_node"));
  if (shape.gpus_per_node > 0 && gpus > shape.gpus_per_node)
    throw UsageError(
        fmt::format("{} {}: site '{}'{} has {} GPUs per node",
                    job.options.count("gpus_per_node") || !site.defaults.count("gpus_per_node") ? job.gpus_flag
                                                                                                : default_source(site, "gpus_per_node"),
                    gpus, site.name,
                    v.count("partition") && site.partitions.count(v.at("partition")) ? " partition " + v.at("partition") : "",
                    shape.gpus_per_node),
        job.gpus_flag == "--gpus-per-node"
            ? fmt::format("use --gpus-per-node {} or fewer, and more nodes (-N) for more GPUs", shape.gpus_per_node)
            : fmt::format("use {} {} or fewer: the job has one node", job.gpus_flag, shape.gpus_per_node));
  if (gpus > 0 && site.max_cores_per_gpu > 0 && v.count("cpus_per_task") && std::stoi(v.at("cpus_per_task")) > site.max_cores_per_gpu)
    throw UsageError(fmt::format("{} {}: site '{}' gives a GPU job at most {} cores per GPU (one task per GPU)",
                                 value_source(site, job, "cpus_per_task"), v.at("cpus_per_task"), site.name, site.max_cores_per_gpu),
                     fmt::format("use --cpus-per-task {} or fewer (a CPU job, --gpus-per-node 0, may take more)", site.max_cores_per_gpu));
  if (gpus > 0 && site.gpu_request.empty())
    throw UsageError(fmt::format("site '{}' has no gpu_request in its profile, so GPUs cannot be asked for", site.name),
                     "add gpu_request to the profile (docs/site-profiles.md), or use --gpus-per-node 0 for a CPU job");
  if (job.signal_before_seconds && site.scheduler != Scheduler::Slurm)
    throw UsageError(fmt::format("--signal-before: site '{}' uses PBS, which has no signal before the time limit", site.name),
                     "checkpoint on a timer inside the job instead");
  if (job.signal && site.scheduler != Scheduler::Slurm)
    throw UsageError(fmt::format("--signal: site '{}' uses PBS, which sends no signal before the walltime", site.name), "drop --signal");
  if (job.max_requeues && site.scheduler != Scheduler::Slurm)
    throw UsageError(fmt::format("--max-requeues: site '{}' uses PBS, which reruns a job itself (--requeue writes -r y)", site.name),
                     "drop --max-requeues");
  if (job.command.empty() && job.body.empty())
    throw UsageError("no program to run", "put it after --: ddl submit --site NAME ... -- python train.py");
  if (job.array) check_array(site, *job.array);
  if (job.exclude) check_exclude(site, *job.exclude);
}

JobScript render_job_script(const SiteProfile& site, const JobRequest& job) {
  check_site_rules(site, job);
  JobScript result;
  result.values = effective_values(site, job);
  const auto& v = result.values;

  std::vector<std::string> directives;
  if (site.scheduler == Scheduler::Slurm) {
    // An array's elements each get a file of their own: the array's id and the element's index.
    if (!v.count("output")) result.values["output"] = job.array ? "ddl-%A_%a.out" : "ddl-%j.out";
    slurm_directives(site, result.values, job, directives);
  } else {
    pbs_directives(site, v, job, directives);
  }
  if (site.container && v.count("image") && !site.container->image_directive.empty())
    directives.push_back(fill(site.container->image_directive, v, site, "container directive"));
  for (const auto& d : site.directives) directives.push_back(fill(d, v, site, "directive"));
  directives.insert(directives.end(), job.extra_directives.begin(), job.extra_directives.end());
  result.output = v.count("output") ? v.at("output") : fmt::format("{}.o<job number>", v.at("job_name"));

  std::string& s = result.text;
  s = "#!/bin/bash\n";
  for (const auto& d : directives) s += directive_prefix(site) + d + "\n";
  s += fmt::format("\n# Generated by ddl {} from the site profile '{}'{}.\n", job.ddl_version, site.name,
                   site.description.empty() ? "" : " (" + site.description + ")");
  s += "set -eo pipefail\n";
  if (site.scheduler == Scheduler::Pbs) s += "cd \"$PBS_O_WORKDIR\"\n";
  for (const auto& path : site.module_use) s += "module use " + shell_quote(path) + "\n";
  if (!site.modules.empty()) {
    s += "module load";
    for (const auto& m : site.modules) s += " " + shell_quote(m);
    s += "\n";
  }
  for (const auto& line : site.setup) s += line + "\n";
  for (const auto& [name, value] : site.environment) s += fmt::format("export {}={}\n", name, shell_quote(value));
  if (job.body.empty()) s += ddl_run_line(site, v, job) + "\n";
  for (const auto& line : job.body) s += line + "\n";
  return result;
}

}  // namespace ddl::backends
