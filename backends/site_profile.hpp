// Site profiles (DESIGN.md section 6, docs/site-profiles.md): what ddl knows about a machine —
// scheduler, login host, GPUs and cores per node, directive defaults, the site's rules, modules,
// environment, launcher and container options. Built-ins are compiled in from templates/sites/;
// a user's $XDG_CONFIG_HOME/ddl/sites/NAME.json adds a site or overrides fields of a built-in.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/scheduler.hpp"

namespace ddl::backends {

struct OptionRule {
  std::string regex;  // the whole value must match
  std::string why;    // the site's rule, in words
  std::string fix;    // what the user should do
};

struct ContainerSupport {
  std::string kind;               // "shifter", "apptainer", "singularity"
  std::string image_directive;    // a batch directive naming the image ("--image={{image}}"), or empty
  std::vector<std::string> wrap;  // what each task runs its program through; {{image}} is replaced
};

// A partition's nodes, where a site's partitions differ (Neuron).
struct NodeShape {
  int gpus_per_node = 0;
  int cores_per_node = 0;
};

// What a queue (PBS -q, or a Slurm QOS) takes: a job outside it is refused by the scheduler, or
// waits in the queue for ever.
struct QueueLimits {
  int min_nodes = 1;
  int max_nodes = 0;     // 0: no limit
  std::string max_time;  // in -t's forms; empty: no limit
};

// How to recognise the site from one of its machines (for `ddl check-build`): the host's full
// name matches `hostname`, or every variable of `environment` matches its pattern.
struct SiteMatch {
  std::string hostname;                            // a regular expression, whole name
  std::map<std::string, std::string> environment;  // NAME -> regular expression of its value
};

struct SiteProfile {
  std::string name;
  std::string description;
  Scheduler scheduler = Scheduler::Slurm;
  std::string login_host;
  int gpus_per_node = 0;
  int cores_per_node = 0;             // 0 when unknown: no core request is made for the user
  std::string gpu_vendor = "nvidia";  // nvidia, amd, intel, none
  std::string launcher;               // srun, pals, mpirun
  std::string gpu_order = "as-listed";
  int max_cores_per_gpu = 0;                     // a GPU job's cores per task (one task per GPU) at most; 0: no limit
  int hang_timeout = 0;                          // seconds: the `ddl run` line's --hang-timeout; 0: none
  std::string nccl_network;                      // the network NCCL must reach between nodes: "ofi" (Slingshot), "" unchecked
  std::string nccl_network_fix;                  // what makes it reach it (a module, a variable)
  std::map<std::string, std::string> defaults;   // option -> value when the user gives none
  std::vector<std::string> required;             // options that must have a value
  std::map<std::string, OptionRule> patterns;    // option -> rule its value must follow
  std::map<std::string, std::string> forbidden;  // option -> why the site refuses it
  std::map<std::string, NodeShape> partitions;   // partition -> its nodes, when they differ
  std::map<std::string, QueueLimits> queues;     // queue -> the jobs it takes, where known
  std::string gpu_request;                       // Slurm directive asking for GPUs ("--gpus-per-node={{gpus}}"); PBS: select chunk
  std::vector<std::string> directives;           // further fixed directives, with {{option}} placeholders
  std::vector<std::string> module_use;
  std::vector<std::string> modules;
  std::vector<std::string> setup;                                // shell lines the site needs before the launch
  std::vector<std::pair<std::string, std::string>> environment;  // exported by name order (values are quoted, so order does not matter)
  std::optional<ContainerSupport> container;
  std::optional<SiteMatch> match;
  nlohmann::json jupyter;  // defaults for `ddl jupyter`
  std::string notes;
  std::map<std::string, std::string> origin;  // field -> "built-in" or the file that set it
};

// Whether `text` is a time limit in one of -t's forms (Slurm's): MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]].
bool is_time_limit(const std::string& text);

// The names of every known site: built-ins and the user's, sorted.
std::vector<std::string> site_names();

// The profile NAME: the built-in, with a user file of the same name laid over it field by field,
// or the user's own. Throws UsageError naming the file and the field when one is malformed, and
// naming the known sites when there is no such site.
SiteProfile load_site(const std::string& name);

// The directory user profiles are read from: $XDG_CONFIG_HOME/ddl/sites or ~/.config/ddl/sites.
std::string user_sites_dir();

// Parses one profile from JSON; `source` names it in errors. Exposed for tests.
SiteProfile parse_site(const nlohmann::json& json, const std::string& source, const std::string& name);

// One site of the listing: its profile, or why it does not load (the message and hint that
// load_site would throw).
struct ListedSite {
  std::string name;
  std::optional<SiteProfile> profile;  // empty when the profile is broken
  std::string error, hint;
};

// Every site (built-in and the user's), each loaded or with its fault, in site_names() order: one
// broken file does not hide the others.
std::vector<ListedSite> list_sites();

// The sites of `listed` whose `match` fits this machine: its full host name and environment.
std::vector<std::string> matching_sites(const std::vector<ListedSite>& listed, const std::string& hostname,
                                        const std::map<std::string, std::string>& environment);

}  // namespace ddl::backends
