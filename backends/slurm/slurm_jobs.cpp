#include "backends/slurm/slurm_jobs.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

namespace ddl::backends::slurm {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// A '%' sequence of an output pattern: the text from `start` to `end` (exclusive), its letter, and
// its zero-padding width.
struct Specifier {
  size_t start = 0, end = 0;
  char letter = 0;
  int width = 0;
};

// The next '%' sequence at or after `from` ("%%" has the letter '%'); nullopt when none is left,
// or when the pattern ends inside one ("%", "%12"), which then stays as it is.
std::optional<Specifier> next_specifier(const std::string& pattern, size_t from) {
  const size_t at = pattern.find('%', from);
  if (at == std::string::npos || at + 1 == pattern.size()) return std::nullopt;
  if (pattern[at + 1] == '%') return Specifier{at, at + 2, '%', 0};
  size_t letter = at + 1;
  while (letter < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[letter]))) ++letter;
  if (letter == pattern.size()) return std::nullopt;
  // slurmstepd pads to at most 10 digits.
  const int width = letter - at - 1 > 2 ? 10 : std::min(10, std::atoi(pattern.substr(at + 1, letter - at - 1).c_str()));
  return Specifier{at, letter + 1, pattern[letter], width};
}

std::string padded(const std::string& number, int width) {
  return number.size() >= static_cast<size_t>(width) ? number : std::string(width - number.size(), '0') + number;
}

bool is_array_task(const JobFacts& facts) { return facts.array_task_id != "N/A" && !facts.array_task_id.empty(); }

// What slurmstepd writes for one '%' sequence of a batch step's pattern; nullopt for a letter it
// does not know (the sequence stays).
std::optional<std::string> expansion(const Specifier& s, const JobFacts& facts, const std::string& job_name) {
  switch (s.letter) {
    case '%': return "%";
    case 'a': return padded(is_array_task(facts) ? facts.array_task_id : "4294967294", s.width);  // Slurm's NO_VAL
    case 'A': return padded(is_array_task(facts) ? facts.array_job_id : facts.job_id, s.width);
    case 'J':  // the batch step has no step number to add
    case 'j': return padded(facts.job_id, s.width);
    case 'n':  // the batch step runs on node 0, as task 0
    case 't': return padded("0", s.width);
    case 'N': return facts.batch_host;
    case 's': return "batch";
    case 'u': return facts.user;
    case 'x': return job_name;
    default: return std::nullopt;
  }
}

// Slurm's remove_path_slashes: each "\\" becomes "\", each other backslash is dropped.
std::string without_escapes(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\') {
      out += pattern[i];
    } else if (i + 1 < pattern.size() && pattern[i + 1] == '\\') {
      out += '\\';
      ++i;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> facts_query(const std::string& id) {
  // -t all: without it squeue leaves out jobs that have ended. ":|" is full width, then '|'.
  return {"squeue", "-h", "-t", "all",
          "-j",     id,   "-O", "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|,UserName:|,BatchHost:|,ArrayJobID:|,ArrayTaskID:|"};
}

std::optional<JobFacts> read_facts(const std::string& squeue_output) {
  const std::string line = squeue_output.substr(0, squeue_output.find('\n'));
  std::vector<std::string> f;
  for (size_t at = 0, bar; (bar = line.find('|', at)) != std::string::npos; at = bar + 1) f.push_back(line.substr(at, bar - at));
  if (f.size() < 9) return std::nullopt;
  return JobFacts{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]};
}

std::optional<std::vector<std::string>> one_field_query(const JobFacts& facts, const std::string& field) {
  // An array task's own number would select every task of its array; ARRAY_TASK selects one.
  std::string record = facts.job_id;
  if (is_array_task(facts)) {
    if (!all_digits(facts.array_task_id)) return std::nullopt;
    record = facts.array_job_id + "_" + facts.array_task_id;
  }
  return std::vector<std::string>{"squeue", "-h", "-t", "all", "-j", record, "-O", field + ":0"};
}

std::string read_one_field(const std::string& squeue_output) {
  return squeue_output.ends_with('\n') ? squeue_output.substr(0, squeue_output.size() - 1) : squeue_output;
}

std::optional<int> exit_status(const std::string& exit_code) {
  if (const auto colon = exit_code.find(':'); colon != std::string::npos) {
    const std::string code = exit_code.substr(0, colon), signal = exit_code.substr(colon + 1);
    if (!all_digits(code) || !all_digits(signal) || code.size() > 3 || signal.size() > 3) return std::nullopt;
    return std::stoi(signal) != 0 ? 128 + std::stoi(signal) : std::stoi(code);
  }
  if (!all_digits(exit_code) || exit_code.size() > 5) return std::nullopt;  // NO_VAL: none recorded
  const int status = std::stoi(exit_code);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

bool pattern_names_job(const std::string& pattern) {
  if (pattern.find('\\') != std::string::npos) return false;
  for (auto s = next_specifier(pattern, 0); s; s = next_specifier(pattern, s->end))
    if (s->letter == 'x') return true;
  return false;
}

std::string batch_output_file(const std::string& pattern, const JobFacts& facts, const std::string& job_name) {
  if (pattern.find('\\') != std::string::npos) return without_escapes(pattern);
  std::string out;
  size_t copied = 0;
  for (auto s = next_specifier(pattern, 0); s; s = next_specifier(pattern, s->end)) {
    if (auto value = expansion(*s, facts, job_name)) {
      out.append(pattern, copied, s->start - copied).append(*value);
      copied = s->end;
    }
  }
  return out.append(pattern, copied);
}

}  // namespace ddl::backends::slurm
