// Checks for numeric flags, with messages a user can act on. CLI11's PositiveNumber printed a
// 309-digit range for -np 0, and its ranges let nan through (every comparison with nan is false).
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace ddl::cli {

// Counts of workers, nodes, GPUs and cores: whole numbers from 1 to 2^20 ("-np abc" is not "out of range").
inline CLI::Validator whole_count(int minimum = 1) {
  constexpr long long most = 1 << 20;
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const long long count = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || count < minimum || count > most)
          return "must be a whole number from " + std::to_string(minimum) + " to " + std::to_string(most) + ", not " + text;
        return {};
      },
      "COUNT");
}

// A finite number of seconds from 0 to `most`.
inline CLI::Validator seconds_at_most(double most) {
  return CLI::Validator(
      [most](std::string& text) -> std::string {
        char* end = nullptr;
        const double seconds = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > most)
          return "must be a number of seconds from 0 to " + std::to_string(static_cast<long long>(most)) + ", not " + text;
        return {};
      },
      "SECONDS");
}

// A value that says something: an empty -H or --output-dir was taken as no flag at all.
inline CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.find_first_not_of(" \t") == std::string::npos) return "must not be empty";
        return {};
      },
      "");
}

}  // namespace ddl::cli
