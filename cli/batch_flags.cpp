#include "cli/batch_flags.hpp"

#include "backends/batch_options.hpp"
#include "cli/validators.hpp"

namespace ddl::cli {

void add_job_options(CLI::App& app, std::map<std::string, std::string>& options, bool workers) {
  for (const backends::BatchOption& option : backends::batch_options()) {
    if (option.workers_only && !workers) continue;
    CLI::Option* flag =
        app.add_option_function<std::string>(
               std::string(option.flags), [&options, key = std::string(option.key)](const std::string& v) { options[key] = v; },
               std::string(option.help))
            ->check(not_empty());                                       // an empty -J or -A would be taken as none given
    if (option.key == "output") flag->transform(home_expanded_path());  // the one path among them
  }
}

void add_directive_and_exclude(CLI::App& app, std::vector<std::string>& directives, std::string& exclude) {
  app.add_option("--directive", directives, "An extra batch directive, e.g. --directive '--exclusive' (repeatable)");
  app.add_option("--exclude", exclude, "Nodes the job must not get, e.g. nid001234,nid[002000-002003] (Slurm --exclude)")
      ->check(not_empty());
}

}  // namespace ddl::cli
