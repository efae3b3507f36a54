// The batch options `ddl submit` and `ddl jupyter start` share (-t, -A, -q, -p, -C, ...), added to a
// command from backends::batch_options(), each value stored under its site-profile key.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddl::cli {

// Adds every batch option to `app`; `workers` adds those of jobs that run workers (-N, --gpus-per-node).
void add_job_options(CLI::App& app, std::map<std::string, std::string>& options, bool workers);

// Adds --directive (repeatable, into `directives`) and --exclude (into `exclude`) to `app`.
void add_directive_and_exclude(CLI::App& app, std::vector<std::string>& directives, std::string& exclude);

}  // namespace ddl::cli
