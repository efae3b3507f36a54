#include "backends/site_profile.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "backends/batch_options.hpp"
#include "backends/builtin_sites.hpp"
#include "common/bounded_regex.hpp"
#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/text_file.hpp"

namespace ddl::backends {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A profile is a page of JSON; anything far larger is not one.
constexpr uintmax_t kLargestProfileBytes = 1 << 20;
// libstdc++'s std::regex recurses once per character it matches and once per nesting level it
// parses: a long subject or pattern overflows the stack. A profile's patterns are short, and what
// a match rule reads (a hostname, a site's variable such as NERSC_HOST) is too.
constexpr size_t kLongestPattern = 512;
constexpr size_t kLongestMatched = 1024;

// Whether all of `text` matches `pattern` (checked by check_pattern); a longer text than
// kLongestMatched matches nothing, nor does a pattern that takes over a second to match it (nested
// repetition backtracking for ever), as a broken profile matches nothing.
bool matches_whole(const std::string& text, const std::string& pattern) {
  if (text.size() > kLongestMatched) return false;
  return match_whole_within(text, pattern, std::chrono::milliseconds(1000)) == RegexMatch::yes;
}

[[noreturn]] void profile_error(const std::string& source, const std::string& field, const std::string& problem) {
  throw UsageError(fmt::format("site profile {}: field '{}' {}", source, field, problem),
                   "fix the field (docs/site-profiles.md describes each one), or remove the file to use the built-in profile");
}

std::string string_field(const json& j, const std::string& source, const char* field) {
  if (!j.contains(field)) return {};
  if (!j[field].is_string()) profile_error(source, field, "must be a string");
  return j[field].get<std::string>();
}

std::vector<std::string> string_list(const json& j, const std::string& source, const char* field) {
  std::vector<std::string> out;
  if (!j.contains(field)) return out;
  if (!j[field].is_array()) profile_error(source, field, "must be a list of strings");
  for (const auto& item : j[field]) {
    if (!item.is_string()) profile_error(source, field, "must be a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::string option_key(const std::string& source, const std::string& field, const std::string& key) {
  std::vector<std::string_view> known;
  for (const BatchOption& option : batch_options()) known.push_back(option.key);
  if (std::find(known.begin(), known.end(), key) == known.end())
    profile_error(source, field + "." + key, fmt::format("names no option of ddl submit (known: {})", fmt::join(known, ", ")));
  return key;
}

// An object of option -> string.
std::map<std::string, std::string> option_strings(const json& j, const std::string& source, const char* field) {
  std::map<std::string, std::string> out;
  if (!j.contains(field)) return out;
  if (!j[field].is_object()) profile_error(source, field, "must be an object of option: value");
  for (const auto& [key, value] : j[field].items()) {
    option_key(source, field, key);
    if (value.is_string())
      out[key] = value.get<std::string>();
    else if (value.is_number_integer())
      out[key] = std::to_string(value.get<long long>());
    else
      profile_error(source, std::string(field) + "." + key, "must be a string or a whole number");
  }
  return out;
}

// Counts of GPUs and cores: far below 32 bits, so nothing is truncated on the way to an int.
constexpr long long kLargestCount = 1 << 20;

int int_field(const json& j, const std::string& source, const char* field, int fallback, int minimum) {
  if (!j.contains(field)) return fallback;
  const json& v = j[field];
  const bool in_range = v.is_number_unsigned() ? v.get<unsigned long long>() <= static_cast<unsigned long long>(kLargestCount)
                                               : v.is_number_integer() && v.get<long long>() <= kLargestCount;
  if (!in_range || v.get<long long>() < minimum)
    profile_error(source, field, fmt::format("must be a whole number from {} to {}", minimum, kLargestCount));
  return static_cast<int>(v.get<long long>());
}

// Options that are counts: a default for one must be a whole number a script can use, and a job
// has at least one node and one core per task (0 GPUs is a CPU job).
void require_count_defaults(const std::map<std::string, std::string>& defaults, const std::string& source) {
  for (const auto& [option, least] : {std::pair{"nodes", 1}, std::pair{"gpus_per_node", 0}, std::pair{"cpus_per_task", 1}}) {
    auto it = defaults.find(option);
    if (it == defaults.end()) continue;
    const std::string& v = it->second;
    const bool whole = !v.empty() && v.size() <= 6 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!whole || std::stoi(v) < least)
      profile_error(source, std::string("defaults.") + option, fmt::format("is '{}'; it must be a whole number, at least {}", v, least));
  }
}

// Every string that can reach a batch script must stay on its line: a newline in a directive,
// a module name or a description would start a line of its own, which the shell would run.
// Only `notes`, which is printed and never written into a script, may hold line breaks.
void refuse_control_characters(const json& j, const std::string& source, const std::string& path) {
  if (j.is_string()) {
    const auto& text = j.get_ref<const std::string&>();
    if (std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
      profile_error(source, path, "contains a newline or another control character; each value must be one line");
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items())
      if (!(path.empty() && key == "notes")) refuse_control_characters(value, source, path.empty() ? key : path + "." + key);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) refuse_control_characters(j[i], source, fmt::format("{}[{}]", path, i));
  }
}

// nlohmann's parser recurses once per level of nesting: refuse absurd depths before parsing.
constexpr int kDeepestNesting = 64;

bool nested_too_deep(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kDeepestNesting) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

std::string one_of(const json& j, const std::string& source, const char* field, std::initializer_list<const char*> allowed,
                   std::string fallback) {
  std::string value = string_field(j, source, field);
  if (value.empty()) return fallback;
  for (const char* a : allowed)
    if (value == a) return value;
  profile_error(source, field, fmt::format("is '{}'; it must be one of {}", value, fmt::join(allowed, ", ")));
}

const std::vector<std::string> kFields = {
    "name",         "description",  "scheduler",        "login_host", "gpus_per_node",    "cores_per_node",
    "gpu_vendor",   "launcher",     "gpu_order",        "defaults",   "required",         "patterns",
    "forbidden",    "partitions",   "gpu_request",      "directives", "module_use",       "modules",
    "setup",        "environment",  "container",        "match",      "jupyter",          "notes",
    "hang_timeout", "nccl_network", "nccl_network_fix", "queues",     "max_cores_per_gpu"};

std::optional<std::string> builtin_text(const std::string& name) {
  for (const auto& site : builtin_sites())
    if (site.name == name) return std::string(site.json);
  return std::nullopt;
}

// Every "{{" in a text a script is filled from opens {{option}}, an option of `ddl submit` or one
// the script derives (tasks_per_node, cpus_per_node): an unclosed one would be written into the
// script as it is, and an unknown one would ask the user for a flag that does not exist.
// Scanned by hand, in one pass: std::regex recurses once per character of a long name.
void check_placeholders(const std::string& source, const std::string& field, const std::string& text) {
  std::vector<std::string> known = {"tasks_per_node", "cpus_per_node"};
  for (const BatchOption& option : batch_options()) known.emplace_back(option.key);
  const auto name_char = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  for (size_t at = text.find("{{"); at != std::string::npos; at = text.find("{{", at + 2)) {
    const size_t start = at + 2;
    size_t end = start;
    while (end < text.size() && name_char(text[end])) ++end;
    if (end == start || text.compare(end, 2, "}}") != 0)
      profile_error(source, field, fmt::format("has '{{{{' without an option name and '}}}}' after it: '{}'", text));
    const std::string name = text.substr(start, end - start);
    if (std::find(known.begin(), known.end(), name) == known.end())
      profile_error(source, field, fmt::format("names {{{{{}}}}}, which is no option (known: {})", name, fmt::join(known, ", ")));
    at = end;
  }
}

// A regular expression of the profile (an option's pattern, a match rule): at most kLongestPattern
// characters (std::regex's parser recurses once per nesting level, so "((((...": a stack overflow),
// and valid.
void check_pattern(const std::string& source, const std::string& field, const std::string& pattern) {
  if (pattern.size() > kLongestPattern)
    profile_error(source, field,
                  fmt::format("is a regular expression of {} characters; at most {} are allowed", pattern.size(), kLongestPattern));
  try {
    std::regex check(pattern);
  } catch (const std::regex_error& e) {
    profile_error(source, field, fmt::format("is not a valid regular expression: {}", e.what()));
  }
}

// A key the profile format does not have in object `j` (the profile itself when `field` is empty):
// a misspelt one ("cpus_per_node" in a partition) would be ignored, and the script would silently lack it.
void refuse_unknown_keys(const json& j, const std::string& source, const std::string& field, const std::vector<std::string>& known) {
  for (const auto& [key, value] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      profile_error(source, field.empty() ? key : field + "." + key,
                    fmt::format("is not a {} field (known: {})", field.empty() ? "profile" : field, fmt::join(known, ", ")));
}

// `ddl jupyter`'s defaults: the two it reads, of the kinds it reads (a number there would be an
// uncaught type error; "program": "emacs" would run `jupyter emacs`).
void check_jupyter_defaults(const json& jupyter, const std::string& source) {
  if (!jupyter.is_object()) profile_error(source, "jupyter", "must be an object");
  for (const auto& [key, value] : jupyter.items()) {
    if (key != "program" && key != "jump_host")
      profile_error(source, "jupyter." + key, "is not a jupyter default (known: program, jump_host)");
    if (!value.is_string()) profile_error(source, "jupyter." + key, "must be a string");
  }
  const std::string program = jupyter.value("program", std::string("lab"));
  if (program != "lab" && program != "notebook" && program != "server")
    profile_error(source, "jupyter.program", fmt::format("is '{}'; it must be one of lab, notebook, server", program));
}

// The text of a user's profile file. Only a regular file (a symlink to one too) is read: a FIFO
// would block `ddl sites` on open(), /dev/zero would never end, a directory would fail deep in the stream.
std::string read_profile_file(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) throw UsageError(fmt::format("site profile {}: cannot be read: {}", path.string(), ec.message()), "fix or remove the link");
  if (!fs::is_regular_file(st))
    throw UsageError(fmt::format("site profile {}: is {}, not a regular file", path.string(),
                                 fs::is_directory(st) ? "a directory"
                                 : fs::is_fifo(st)    ? "a FIFO"
                                                      : "a device or socket"),
                     "remove it, or put the profile's JSON in a file of that name");
  return read_text_file(path.string(), "site profile", kLargestProfileBytes);
}

json parse_json(const std::string& text, const std::string& source) {
  if (nested_too_deep(text))
    throw UsageError(fmt::format("site profile {}: nested more than {} levels deep", source, kDeepestNesting),
                     "fix the file, or remove it");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // syntax, and numbers out of range such as 1e999
    throw UsageError(fmt::format("site profile {}: not valid JSON: {}", source, e.what()), "fix the file, or remove it");
  }
  if (!j.is_object()) throw UsageError(fmt::format("site profile {}: must be a JSON object", source), "see docs/site-profiles.md");
  refuse_control_characters(j, source, "");
  return j;
}

}  // namespace

std::string user_sites_dir() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && *xdg != '\0') return fs::path(xdg) / "ddl" / "sites";
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "/") / ".config" / "ddl" / "sites";
}

std::vector<std::string> site_names() {
  std::vector<std::string> names;
  for (const auto& site : builtin_sites()) names.emplace_back(site.name);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(user_sites_dir(), ec))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

SiteProfile parse_site(const json& j, const std::string& source, const std::string& name) {
  refuse_unknown_keys(j, source, "", kFields);
  SiteProfile p;
  p.name = name;
  p.description = string_field(j, source, "description");
  const std::string scheduler = one_of(j, source, "scheduler", {"slurm", "pbs"}, "");
  if (scheduler.empty()) profile_error(source, "scheduler", "is missing; it must be slurm or pbs");
  p.scheduler = *scheduler_from_key(scheduler);
  p.login_host = string_field(j, source, "login_host");
  p.gpus_per_node = int_field(j, source, "gpus_per_node", 0, 0);
  p.cores_per_node = int_field(j, source, "cores_per_node", 0, 0);  // 0: unknown
  p.gpu_vendor = one_of(j, source, "gpu_vendor", {"nvidia", "amd", "intel", "none"}, "nvidia");
  p.launcher = one_of(j, source, "launcher", {"srun", "pals", "mpirun"}, p.scheduler == Scheduler::Slurm ? "srun" : "mpirun");
  p.gpu_order = one_of(j, source, "gpu_order", {"as-listed", "reverse"}, "as-listed");
  p.hang_timeout = int_field(j, source, "hang_timeout", 0, 0);
  p.max_cores_per_gpu = int_field(j, source, "max_cores_per_gpu", 0, 0);
  p.nccl_network = one_of(j, source, "nccl_network", {"ofi"}, "");
  p.nccl_network_fix = string_field(j, source, "nccl_network_fix");
  p.defaults = option_strings(j, source, "defaults");
  require_count_defaults(p.defaults, source);
  for (const auto& option : string_list(j, source, "required")) p.required.push_back(option_key(source, "required", option));
  if (j.contains("patterns")) {
    if (!j["patterns"].is_object()) profile_error(source, "patterns", "must be an object of option: {regex, why, fix}");
    for (const auto& [option, rule] : j["patterns"].items()) {
      const std::string field = "patterns." + option_key(source, "patterns", option);
      if (!rule.is_object() || !rule.contains("regex") || !rule["regex"].is_string())
        profile_error(source, field, "must be an object with a string 'regex' (and 'why', 'fix')");
      refuse_unknown_keys(rule, source, field, {"regex", "why", "fix"});
      OptionRule r{rule["regex"].get<std::string>(), string_field(rule, source + " " + field, "why"),
                   string_field(rule, source + " " + field, "fix")};
      check_pattern(source, field + ".regex", r.regex);
      p.patterns[option] = r;
    }
  }
  p.forbidden = option_strings(j, source, "forbidden");
  if (j.contains("partitions")) {
    if (!j["partitions"].is_object())
      profile_error(source, "partitions", "must be an object of partition: {gpus_per_node, cores_per_node}");
    for (const auto& [partition, shape] : j["partitions"].items()) {
      const std::string field = "partitions." + partition;
      if (!shape.is_object()) profile_error(source, field, "must be an object {gpus_per_node, cores_per_node}");
      refuse_unknown_keys(shape, source, field, {"gpus_per_node", "cores_per_node"});
      p.partitions[partition] = {int_field(shape, source + " " + field, "gpus_per_node", p.gpus_per_node, 0),
                                 int_field(shape, source + " " + field, "cores_per_node", p.cores_per_node, 0)};
    }
  }
  if (j.contains("queues")) {
    if (!j["queues"].is_object()) profile_error(source, "queues", "must be an object of queue: {min_nodes, max_nodes, max_time}");
    for (const auto& [queue, limits] : j["queues"].items()) {
      const std::string field = "queues." + queue;
      if (!limits.is_object()) profile_error(source, field, "must be an object {min_nodes, max_nodes, max_time}");
      refuse_unknown_keys(limits, source, field, {"min_nodes", "max_nodes", "max_time"});
      QueueLimits& q = p.queues[queue];
      q.min_nodes = int_field(limits, source + " " + field, "min_nodes", 1, 1);
      q.max_nodes = int_field(limits, source + " " + field, "max_nodes", 0, 0);
      if (q.max_nodes > 0 && q.max_nodes < q.min_nodes)
        profile_error(source, field + ".max_nodes", fmt::format("is {}, fewer than min_nodes {}", q.max_nodes, q.min_nodes));
      q.max_time = string_field(limits, source + " " + field, "max_time");
      if (!q.max_time.empty() && !is_time_limit(q.max_time))
        profile_error(source, field + ".max_time", fmt::format("is '{}', not a time limit (HH:MM:SS, MM or D-HH:MM:SS)", q.max_time));
    }
  }
  p.gpu_request = string_field(j, source, "gpu_request");
  check_placeholders(source, "gpu_request", p.gpu_request);
  p.directives = string_list(j, source, "directives");
  for (size_t i = 0; i < p.directives.size(); ++i) check_placeholders(source, fmt::format("directives[{}]", i), p.directives[i]);
  p.module_use = string_list(j, source, "module_use");
  p.modules = string_list(j, source, "modules");
  p.setup = string_list(j, source, "setup");
  if (j.contains("environment")) {
    if (!j["environment"].is_object()) profile_error(source, "environment", "must be an object of NAME: value");
    for (const auto& [var, value] : j["environment"].items()) {
      if (!is_variable_name(var)) profile_error(source, "environment." + var, "is not a shell variable name");
      if (!value.is_string()) profile_error(source, "environment." + var, "must be a string");
      p.environment.emplace_back(var, value.get<std::string>());
    }
  }
  if (j.contains("container")) {
    const json& c = j["container"];
    if (!c.is_object()) profile_error(source, "container", "must be an object {kind, image_directive, wrap}");
    refuse_unknown_keys(c, source, "container", {"kind", "image_directive", "wrap"});
    ContainerSupport support;
    support.kind = one_of(c, source + " container", "kind", {"shifter", "apptainer", "singularity"}, "");
    if (support.kind.empty()) profile_error(source, "container.kind", "is missing; it must be shifter, apptainer or singularity");
    support.image_directive = string_field(c, source, "image_directive");
    check_placeholders(source, "container.image_directive", support.image_directive);
    support.wrap = string_list(c, source, "wrap");
    for (size_t i = 0; i < support.wrap.size(); ++i) check_placeholders(source, fmt::format("container.wrap[{}]", i), support.wrap[i]);
    p.container = support;
  }
  if (j.contains("match")) {
    const json& m = j["match"];
    if (!m.is_object()) profile_error(source, "match", "must be an object {hostname, environment}");
    refuse_unknown_keys(m, source, "match", {"hostname", "environment"});
    SiteMatch match;
    match.hostname = string_field(m, source + " match", "hostname");
    if (m.contains("environment")) {
      if (!m["environment"].is_object()) profile_error(source, "match.environment", "must be an object of NAME: regex");
      for (const auto& [var, pattern] : m["environment"].items()) {
        if (!pattern.is_string()) profile_error(source, "match.environment." + var, "must be a string");
        match.environment[var] = pattern.get<std::string>();
        check_pattern(source, "match.environment." + var, match.environment[var]);
      }
    }
    check_pattern(source, "match.hostname", match.hostname);
    p.match = match;
  }
  p.jupyter = j.value("jupyter", json::object());
  check_jupyter_defaults(p.jupyter, source);
  p.notes = string_field(j, source, "notes");
  if (j.contains("name") && string_field(j, source, "name") != name)
    profile_error(source, "name",
                  fmt::format("is '{}' but the file defines site '{}'; make them equal", j["name"].get<std::string>(), name));
  return p;
}

std::vector<ListedSite> list_sites() {
  std::vector<ListedSite> listed;
  for (const auto& name : site_names()) {
    try {
      listed.push_back({name, load_site(name), "", ""});
    } catch (const Error& e) {
      listed.push_back({name, std::nullopt, e.what(), e.hint()});
    }
  }
  return listed;
}

bool is_time_limit(const std::string& text) {
  static const std::regex form(R"((\d{1,4}-)?\d{1,7}(:\d{1,2}){0,2})");
  return text.size() <= 32 && std::regex_match(text, form);
}

std::vector<std::string> matching_sites(const std::vector<ListedSite>& sites, const std::string& hostname,
                                        const std::map<std::string, std::string>& environment) {
  std::vector<std::string> found;
  for (const auto& listed : sites) {
    if (!listed.profile || !listed.profile->match) continue;  // a broken profile matches nothing
    const SiteProfile& site = *listed.profile;
    const std::string& name = listed.name;
    bool by_host = !site.match->hostname.empty() && matches_whole(hostname, site.match->hostname);
    bool by_env = !site.match->environment.empty();
    for (const auto& [var, pattern] : site.match->environment) {
      auto it = environment.find(var);
      by_env = by_env && it != environment.end() && matches_whole(it->second, pattern);
    }
    if (by_host || by_env) found.push_back(name);
  }
  return found;
}

namespace {

// A site's name names its file in the sites folder and is written into job scripts (a comment):
// letters, digits, '.', '_' and '-', not starting with '.', so it can neither reach outside that
// folder nor end the comment's line.
void check_site_name(const std::string& name) {
  const bool fine = !name.empty() && name.size() <= 128 && name.front() != '.' && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!fine)
    throw UsageError(fmt::format("--site {:?}: a site name has letters, digits, '.', '_' and '-' only (at most 128, not starting with '.')",
                                 name.substr(0, 200)),
                     fmt::format("name the profile file NAME.json in {} with such a NAME, and pass --site NAME", user_sites_dir()));
}

}  // namespace

SiteProfile load_site(const std::string& name) {
  check_site_name(name);
  const fs::path user_file = fs::path(user_sites_dir()) / (name + ".json");
  std::optional<std::string> builtin = builtin_text(name);
  std::optional<std::string> user;
  if (std::error_code ec; fs::exists(fs::symlink_status(user_file, ec))) user = read_profile_file(user_file);
  if (!builtin && !user)
    throw UsageError(fmt::format("no site profile named '{}' (known: {})", name, fmt::join(site_names(), ", ")),
                     fmt::format("pick one of those, or write {}", user_file.string()));

  json merged = builtin ? parse_json(*builtin, "built-in " + name) : json::object();
  std::map<std::string, std::string> origin;
  for (const auto& [key, value] : merged.items()) origin[key] = "built-in";
  const json builtin_defaults = merged.value("defaults", json::object());
  for (const auto& [key, value] : builtin_defaults.items()) origin["defaults." + key] = "built-in";
  if (user) {
    const json overlay = parse_json(*user, user_file.string());
    for (const auto& [key, value] : overlay.items()) {
      // Defaults merge option by option; every other field is replaced whole.
      if (key == "defaults" && value.is_object() && merged.contains("defaults") && merged["defaults"].is_object()) {
        for (const auto& [option, v] : value.items()) {
          merged["defaults"][option] = v;
          origin["defaults." + option] = user_file.string();
        }
      } else {
        merged[key] = value;
        origin[key] = user_file.string();
        if (key == "defaults" && value.is_object())
          for (const auto& [option, v] : value.items()) origin["defaults." + option] = user_file.string();
      }
    }
  }
  SiteProfile profile = parse_site(merged, user ? user_file.string() : "built-in " + name, name);
  profile.origin = origin;
  return profile;
}

}  // namespace ddl::backends
