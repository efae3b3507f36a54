// ddl: the command line. Parses, calls the launcher, prints; the one place errors are printed.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/agent_command.hpp"
#include "cli/check_build_command.hpp"
#include "cli/exec_command.hpp"
#include "cli/job_commands.hpp"
#include "cli/jupyter_command.hpp"
#include "cli/run_command.hpp"
#include "cli/sites_command.hpp"
#include "cli/submit_command.hpp"
#include "common/error.hpp"
#include "launcher/worker_process.hpp"

namespace {

struct SplitArguments {
  std::vector<std::string> ddl_args;                // ddl's own, for CLI11 ("-np" spelled "--np")
  std::vector<std::string> as_typed;                // the same words as the user typed them
  std::optional<std::vector<std::string>> program;  // everything after the first "--"
};

// Splits at the first "--": what follows is the program and its arguments, untouched. mpirun
// users type "-np 4"; CLI11 reads single-dash names as one letter, so ddl's "-np" becomes "--np".
SplitArguments split_arguments(int argc, char** argv) {
  SplitArguments split;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      split.program = std::vector<std::string>(argv + i + 1, argv + argc);
      break;
    }
    split.as_typed.push_back(a);
    if (a == "-np")
      a = "--np";
    else if (a.rfind("-np=", 0) == 0)
      a = "-" + a;
    split.ddl_args.push_back(a);
  }
  return split;
}

// How many of the last words the selected subcommand left unparsed: a program and its arguments
// given without "--" (run, exec and submit stop parsing at the program's name).
size_t words_left_to_program(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    if (sub->parsed()) return sub->remaining_size();
  return 0;
}

// Parses ddl's words and returns the program when it came after "--". The "-np" spelling is for
// ddl's own flags, and "--" separates ddl's words from the program only before the program's name:
// when the program follows without "--", its words are parsed again as typed, so
// `ddl run -np 2 prog -np 7 -- x` hands prog "-np 7 -- x".
std::optional<std::vector<std::string>> parse_ddl_arguments(CLI::App& app, const SplitArguments& split) {
  auto parse = [&app](std::vector<std::string> words) {
    std::reverse(words.begin(), words.end());  // CLI11 takes them last-first
    app.parse(words);
  };
  parse(split.ddl_args);
  const size_t program_words = words_left_to_program(app);
  if (program_words == 0) return split.program;
  const size_t ddl_words = split.ddl_args.size() - program_words;
  std::vector<std::string> words(split.ddl_args.begin(), split.ddl_args.begin() + ddl_words);
  words.insert(words.end(), split.as_typed.begin() + ddl_words, split.as_typed.end());
  if (split.program) {
    words.emplace_back("--");
    words.insert(words.end(), split.program->begin(), split.program->end());
  }
  if (words != split.ddl_args) parse(std::move(words));
  return std::nullopt;
}

void print_error(const std::string& message, const std::string& hint) {
  std::fprintf(stderr, "ddl: error: %s\n", message.c_str());
  if (!hint.empty()) std::fprintf(stderr, "hint: %s\n", hint.c_str());
}

// ddl's exit status for an error: 2 for a usage mistake, 127 for a program that cannot be run (as
// a shell), 1 for anything else.
int exit_status_for(const ddl::Error& e) {
  if (dynamic_cast<const ddl::UsageError*>(&e)) return 2;
  if (dynamic_cast<const ddl::launcher::ProgramNotRunnable*>(&e)) return 127;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddl: launch and supervise distributed deep-learning training", "ddl"};
  app.set_version_flag("--version", std::string(DDL_VERSION));
  app.require_subcommand(1);
  app.allow_extras();  // `run` passes its program and arguments through (see RunCommand)
  ddl::cli::RunCommand run(app);
  ddl::cli::ExecCommand exec(app);
  ddl::cli::SubmitCommand submit(app);
  ddl::cli::SitesCommand sites(app);
  ddl::cli::JobCommands jobs(app);
  ddl::cli::JupyterCommand jupyter(app);
  ddl::cli::CheckBuildCommand check_build(app);
  ddl::cli::AgentCommand agent(app);

  const SplitArguments split = split_arguments(argc, argv);
  std::optional<std::vector<std::string>> program;
  try {
    program = parse_ddl_arguments(app, split);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what(), "see `ddl --help` or `ddl run --help`");
    return 2;
  }
  try {
    if (run.selected()) return run.execute(program);
    if (exec.selected()) exec.execute(program);
    if (submit.selected()) return submit.execute(program);
    if (sites.selected()) return sites.execute();
    if (jobs.selected()) return jobs.execute();
    if (jupyter.selected()) return jupyter.execute();
    if (check_build.selected()) return check_build.execute();
    if (agent.selected()) return agent.execute();
  } catch (const ddl::Error& e) {
    print_error(e.what(), e.hint());
    return exit_status_for(e);
  } catch (const std::exception& e) {
    print_error(e.what(), "this is a bug in ddl; please report it with the command you ran");
    return 1;
  }
  return 0;
}
