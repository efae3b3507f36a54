#include "launcher/program_separators.hpp"

#include <algorithm>

namespace ddl::launcher {
namespace {

// Backslashes then one colon: the words the escape changes (with no backslash: ":" itself).
bool is_separator_form(const std::string& word, std::size_t min_backslashes) {
  if (word.size() < min_backslashes + 1 || word.back() != ':') return false;
  return std::all_of(word.begin(), word.end() - 1, [](char c) { return c == '\\'; });
}

}  // namespace

std::vector<std::string> escape_program_separators(std::vector<std::string> words) {
  for (auto& word : words)
    if (is_separator_form(word, 0)) word.insert(word.begin(), '\\');
  return words;
}

std::vector<std::string> unescape_program_separators(std::vector<std::string> words) {
  for (auto& word : words)
    if (is_separator_form(word, 1)) word.erase(word.begin());
  return words;
}

}  // namespace ddl::launcher
