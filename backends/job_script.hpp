// A batch script for `ddl submit`: the site's rules checked first, then its directives, modules,
// environment and the `ddl run` line rendered, every value a user gave shell-quoted or refused.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/batch_options.hpp"
#include "backends/site_profile.hpp"

namespace ddl::backends {

struct JobRequest {
  std::map<std::string, std::string> options;  // batch_options() key -> value the user gave
  std::vector<std::string> extra_directives;   // --directive, each written after the scheduler's prefix
  std::optional<int> signal_before_seconds;    // --signal-before: the signal this long before the time limit
  std::optional<std::string> signal;           // --signal (USR1 unless given): the one sent to ddl run, which passes it on
  bool requeue = false;                        // --requeue: ddl run requeues the job on that signal (PBS: rerunnable)
  std::optional<int> max_requeues;             // --max-requeues, for ddl run
  std::optional<std::string> array;            // --array: the elements of a job array ("0-15%4"; Slurm --array, PBS -J)
  std::optional<std::string> exclude;          // --exclude: nodes the job must not get ("nid[001-004],gpu7"; Slurm only)
  std::vector<std::string> command;            // the program and its arguments
  std::string ddl_program = "ddl";             // how the script calls ddl (an absolute path when submitting)
  std::string ddl_version;
  // Lines ddl itself wrote (values already quoted) that end the script instead of `ddl run`:
  // `ddl jupyter` runs one server, not workers.
  std::vector<std::string> body;
  // The flag the user gave the GPUs per node with, for errors: `ddl jupyter start` calls it --gpus
  // (its one node is not to be multiplied).
  std::string gpus_flag = "--gpus-per-node";
};

// Seconds before the time limit that the signal comes with --requeue and no --signal-before. Slurm
// looks at time limits about every 30 s, so it can come that much later.
inline constexpr int kRequeueSignalBefore = 120;

struct JobScript {
  std::string text;                           // the whole script
  std::map<std::string, std::string> values;  // every option's value after defaults
  std::string output;                         // where the job's output goes ("ddl-%j.out")
};

// Checks the request against the site: required options, value patterns, forbidden options, GPUs
// per node, and values a batch directive cannot carry. Throws UsageError naming the rule and the fix.
void check_site_rules(const SiteProfile& site, const JobRequest& job);

// Checks the rules, then renders the script.
JobScript render_job_script(const SiteProfile& site, const JobRequest& job);

// The GPUs per node of the partition `options` (or the site's defaults) name, else the site's.
int partition_gpus(const SiteProfile& site, const std::map<std::string, std::string>& options);

// Seconds in one of Slurm's time forms (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S), as -t takes and
// squeue's time left (%L) shows. `slurm_time` must be one: std::stoi throws on other text.
long time_limit_seconds(const std::string& slurm_time);

// `s` as one word of bash that expands to exactly `s`: single quotes where needed, and each
// carriage return as $'\r', so a script holds none.
std::string shell_quote(std::string_view s);

}  // namespace ddl::backends
