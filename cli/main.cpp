// ddl: the command line. Parses, calls the launcher, prints; the one place errors are printed.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "cli/agent_command.hpp"
#include "cli/check_build_command.hpp"
#include "cli/exec_command.hpp"
#include "cli/job_commands.hpp"
#include "cli/jupyter_command.hpp"
#include "cli/preflight_probe_command.hpp"
#include "cli/run_command.hpp"
#include "cli/sites_command.hpp"
#include "cli/submit_command.hpp"
#include "common/error.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/worker_process.hpp"

namespace {

void print_error(const std::string& message, const std::string& hint);
int run_ddl(int argc, char** argv);

struct SplitArguments {
  std::vector<std::string> ddl_args;                // ddl's own, for CLI11 ("-np" spelled "--np")
  std::vector<std::string> as_typed;                // the same words as the user typed them
  std::optional<std::vector<std::string>> program;  // everything after the first "--"
};

// Whether `word` names an option of ddl (any command's) that takes a value, as the next word.
bool takes_next_word(const CLI::App& app, const std::string& word) {
  if (!word.starts_with('-') || word.find('=') != std::string::npos) return false;
  if (const CLI::Option* option = app.get_option_no_throw(word)) return option->get_expected_min() > 0;
  for (const CLI::App* sub : app.get_subcommands({}))
    if (takes_next_word(*sub, word)) return true;
  return false;
}

// Splits at the first "--": what follows is the program and its arguments, untouched. mpirun
// users type "-np 4"; CLI11 reads single-dash names as one letter, so ddl's "-np" becomes "--np".
SplitArguments split_arguments(const CLI::App& app, int argc, char** argv) {
  SplitArguments split;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      split.program = std::vector<std::string>(argv + i + 1, argv + argc);
      break;
    }
    split.as_typed.push_back(a);
    // Only the flag: a value that reads "-np" (`-J -np`, `--comment -np=3`) stays as typed.
    const bool is_a_value = i > 1 && takes_next_word(app, argv[i - 1]);
    if (!is_a_value && a == "-np")
      a = "--np";
    else if (!is_a_value && a.rfind("-np=", 0) == 0)
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

// Letters to change, add or drop to turn a into b (for "did you mean").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The first word must be a command (or --help/--version): say which word is wrong and what was meant,
// rather than CLI11's "A subcommand is required".
void check_command_word(const CLI::App& app, const std::vector<std::string>& words) {
  if (words.empty()) return;
  const std::string& word = words.front();
  if (word == "-h" || word == "--help" || word == "--help-all" || word == "--version") return;
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == word) return;
    if (!sub->get_group().empty()) names.push_back(sub->get_name());  // hidden ones (the agent) not offered
  }
  const std::string commands = fmt::format("the commands are {}; see `ddl --help`", fmt::join(names, ", "));
  if (word.starts_with("-"))
    throw ddl::UsageError(fmt::format("{} comes before a command", word),
                          fmt::format("options follow the command they belong to, e.g. `ddl run {} ...`; {}", word, commands));
  std::string closest;
  for (const auto& name : names)
    if (edit_distance(word, name) <= 2 && (closest.empty() || edit_distance(word, name) < edit_distance(word, closest))) closest = name;
  throw ddl::UsageError(fmt::format("'{}' is not a ddl command", word),
                        closest.empty() ? commands : fmt::format("did you mean `ddl {}`? {}", closest, commands));
}

// The deepest command the parse reached (`sites show` under `sites`); the top-level app before any.
const CLI::App* parsed_command(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    if (sub->parsed()) return parsed_command(*sub);
  return &app;
}

// "ddl sites show" for the `show` command under `sites`.
std::string command_line_name(const CLI::App* command) {
  std::vector<std::string> names;
  for (; command != nullptr; command = command->get_parent()) names.insert(names.begin(), command->get_name());
  return fmt::format("{}", fmt::join(names, " "));
}

// CLI11's words for an error, or ours where they say less than they could: a flag given twice was
// "--np: At Most 1 required but received 2".
std::string in_words(const CLI::ParseError& e) {
  std::string said = e.what();
  constexpr std::string_view at_most_once = ": At Most 1 required but received ";
  const size_t at = said.find(at_most_once);
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr && at != std::string::npos)
    return fmt::format("{} is given {} times; give it once", said.substr(0, at), said.substr(at + at_most_once.size()));
  return said;
}

// CLI11's parse error as one line naming the command, and a hint to that command's own help. A word
// the command does not know is named first, even where CLI11 would first say what is missing.
void print_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App* command = parsed_command(app);
  const std::string name = command_line_name(command);
  const std::string help = fmt::format("see `{} --help`", name);
  const std::vector<std::string> unknown = command->remaining();
  if (command != &app && !unknown.empty()) {
    const std::string& word = unknown.front();
    print_error(fmt::format("{} has no {} {}", name, word.starts_with("-") ? "option" : "argument", word), help);
    return;
  }
  print_error(in_words(e), help);
}

// A message that quotes a huge value (a 100,000-character name) cut to its start and end: the
// line stays readable, and a log is not flooded.
std::string shown(const std::string& text) {
  constexpr size_t kLongest = 4096, kHead = 1500, kTail = 500;
  if (text.size() <= kLongest) return text;
  return fmt::format("{} [... {} characters cut ...] {}", text.substr(0, kHead), text.size() - kHead - kTail,
                     text.substr(text.size() - kTail));
}

void print_error(const std::string& message, const std::string& hint) {
  std::fprintf(stderr, "ddl: error: %s\n", shown(message).c_str());
  if (!hint.empty()) std::fprintf(stderr, "hint: %s\n", shown(hint).c_str());
}

// ddl's exit status for an error: 2 for a usage mistake, 127 for a program that cannot be run (as
// a shell), 1 for anything else.
int exit_status_for(const ddl::Error& e) {
  if (dynamic_cast<const ddl::UsageError*>(&e)) return 2;
  if (dynamic_cast<const ddl::launcher::ProgramNotRunnable*>(&e)) return 127;
  return 1;
}

// `status`, unless what ddl wrote to its stdout did not all get there (a full disk under `ddl submit
// --dry-run > job.sh`, /dev/full): then an error saying so, as a shell's own commands do, so that a
// cut-short file is not taken for a whole one.
int checked_stdout(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && !std::ferror(stdout)) return status;
  print_error(fmt::format("cannot write standard output: {}", error != 0 ? std::strerror(error) : "a write failed"),
              "make room where it goes, or send it elsewhere");
  return status == 0 ? 1 : status;
}

}  // namespace

int main(int argc, char** argv) {
  // ddl waits for what it starts (workers, srun, sbatch...). A parent that ignores SIGCHLD passes that
  // on across exec, and the kernel would then reap ddl's children itself: `ddl run` never saw its
  // workers end and waited for ever, deaf to SIGTERM.
  ::signal(SIGCHLD, SIG_DFL);
  return checked_stdout(run_ddl(argc, argv));
}

namespace {

// Only run, exec and submit take a program after --: elsewhere its words would be dropped unseen
// (`ddl status -- 4242` listed every job). Checked before parsing, which would complain of
// something else (`ddl cancel -- 4242`: "job is required").
void refuse_program_of_a_command_without_one(const CLI::App& app, const SplitArguments& split) {
  if (!split.program || split.as_typed.empty()) return;
  std::string path;
  const CLI::App* command = &app;
  for (const std::string& word : split.as_typed) {  // the command's words: "status", "jupyter start"
    const CLI::App* sub = nullptr;
    try {
      if (!word.starts_with("-")) sub = command->get_subcommand(word);
    } catch (const CLI::Error&) {  // no such subcommand: the command's own words have ended
    }
    if (sub == nullptr) break;
    command = sub;
    path += (path.empty() ? "" : " ") + word;
  }
  if (path.empty() || path == "run" || path == "exec" || path == "submit") return;
  throw ddl::UsageError(fmt::format("ddl {} takes nothing after --, but was given '{}'", path, fmt::join(*split.program, " ")),
                        "drop the -- (only ddl run, ddl exec and ddl submit take a program after it)");
}

int run_ddl(int argc, char** argv) {
  ddl::launcher::hold_standard_descriptors();
  CLI::App app{"ddl: launch and supervise distributed deep-learning training", "ddl"};
  app.set_version_flag("--version", std::string(DDL_VERSION));
  app.require_subcommand(1);  // no extras: every command refuses a word it does not know (run's program is a prefix command's)
  ddl::cli::RunCommand run(app);
  ddl::cli::ExecCommand exec(app);
  ddl::cli::SubmitCommand submit(app);
  ddl::cli::SitesCommand sites(app);
  ddl::cli::JobCommands jobs(app);
  ddl::cli::JupyterCommand jupyter(app);
  ddl::cli::CheckBuildCommand check_build(app);
  ddl::cli::AgentCommand agent(app);
  ddl::cli::PreflightProbeCommand preflight_probe(app);

  const SplitArguments split = split_arguments(app, argc, argv);
  std::optional<std::vector<std::string>> program;
  try {
    check_command_word(app, split.as_typed);
    refuse_program_of_a_command_without_one(app, split);
    program = parse_ddl_arguments(app, split);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_parse_error(app, e);
    return 2;
  } catch (const ddl::UsageError& e) {
    print_error(e.what(), e.hint());
    return 2;
  }
  try {
    if (run.selected()) return run.execute(program);
    if (exec.selected()) return exec.execute(program);
    if (submit.selected()) return submit.execute(program);
    if (sites.selected()) return sites.execute();
    if (jobs.selected()) return jobs.execute();
    if (jupyter.selected()) return jupyter.execute();
    if (check_build.selected()) return check_build.execute();
    if (agent.selected()) return agent.execute();
    if (preflight_probe.selected()) return preflight_probe.execute();
  } catch (const ddl::Error& e) {
    print_error(e.what(), e.hint());
    return exit_status_for(e);
  } catch (const std::exception& e) {
    print_error(e.what(), "this is a bug in ddl; please report it with the command you ran");
    return 1;
  }
  return 0;
}

}  // namespace
