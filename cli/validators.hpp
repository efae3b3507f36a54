// Checks for flags' values, with messages a user can act on, and the shell's `~` for paths. For
// numbers: CLI11's PositiveNumber printed a 309-digit range for -np 0, and its ranges let nan
// through (every comparison with nan is false).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "common/home_path.hpp"

namespace ddl::cli {

// Plain decimal digits, with a fraction when `fraction` (strtol and strtod also take blanks, a sign,
// hex and exponents: "-np +2", "--grace-period 0x10" meant nothing a user wrote on purpose).
inline bool plain_decimal(const std::string& text, bool fraction) {
  const size_t point = fraction ? text.find('.') : std::string::npos;
  const std::string whole = text.substr(0, point);
  const std::string part = point == std::string::npos ? std::string() : text.substr(point + 1);
  const auto digits_only = [](const std::string& s) { return s.find_first_not_of("0123456789") == std::string::npos; };
  return !(whole.empty() && part.empty()) && digits_only(whole) && digits_only(part);
}

// A whole number from `minimum` to `most`, in plain decimal digits, written back without leading zeros:
// CLI11 reads integers as C does (base 0), so "-np 010" was 8 workers and "08" not a number. Used
// with ->transform(), which keeps the rewritten text ("abc" is "not abc", not "out of range").
inline CLI::Validator whole_number_between(long long minimum, long long most) {
  return CLI::Validator(
      [minimum, most](std::string& text) -> std::string {
        const std::string digits = text.substr(std::min(text.find_first_not_of('0'), text.empty() ? 0 : text.size() - 1));
        char* end = nullptr;
        const long long number = std::strtoll(digits.c_str(), &end, 10);
        if (!plain_decimal(text, false) || digits.size() > 18 || *end != '\0' || number < minimum || number > most)
          return "must be a whole number from " + std::to_string(minimum) + " to " + std::to_string(most) + ", not " + text;
        text = digits;
        return {};
      },
      "");
}

// Counts of workers, nodes, GPUs and cores: whole numbers from `minimum` to 2^20.
inline CLI::Validator whole_count(int minimum = 1) { return whole_number_between(minimum, 1 << 20).description("COUNT"); }

// A finite number of seconds from 0 to `most`.
inline CLI::Validator seconds_at_most(double most) {
  return CLI::Validator(
      [most](std::string& text) -> std::string {
        char* end = nullptr;
        const double seconds = std::strtod(text.c_str(), &end);
        if (!plain_decimal(text, true) || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > most)
          return "must be a number of seconds from 0 to " + std::to_string(static_cast<long long>(most)) + ", not " + text;
        return {};
      },
      "SECONDS");
}

// A value that says something: an empty -H or --output-dir would be taken as no flag at all.
inline CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.find_first_not_of(" \t") == std::string::npos) return "must not be empty";
        return {};
      },
      "");
}

// A path flag's value with a leading `~` made the home folder, as the shell makes it where it sees
// it: `--output-dir=~/runs` would otherwise name a folder called `~`. Used with ->transform().
inline CLI::Validator home_expanded_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        text = with_home_expanded(text);
        return {};
      },
      "");
}

}  // namespace ddl::cli
