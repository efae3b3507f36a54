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

}  // namespace ddl::cli
