#include "common/environment.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl {

Environment current_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> to_envp(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

bool is_variable_name(std::string_view name) {
  const auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  return !name.empty() && letter(name.front()) && std::all_of(name.begin(), name.end(), [&](char c) { return letter(c) || digit(c); });
}

std::optional<long long> whole_number(std::string_view text, long long maximum) {
  if (text.empty()) return std::nullopt;
  long long n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
    if (n > maximum) return std::nullopt;  // before it can overflow
  }
  return n;
}

std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

double number_setting(const std::string& name, const std::string& value, double minimum, double maximum) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(number) || number < minimum || number > maximum)
    throw Error(fmt::format("{}='{}' is not a number from {} to {}", name, value, minimum, maximum),
                fmt::format("set {} to a plain number in that range, or unset it", name));
  return number;
}

double number_from_environment(const char* name, double fallback, double minimum, double maximum) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return number_setting(name, value, minimum, maximum);
}

double number_from_environment(const contract::NumberSetting& setting) {
  return number_from_environment(setting.name, setting.fallback, setting.minimum, setting.maximum);
}

double number_setting(const contract::NumberSetting& setting, const std::string& value) {
  return number_setting(setting.name, value, setting.minimum, setting.maximum);
}

std::chrono::milliseconds timeout_setting(const std::string& value) {
  const double seconds = number_setting(contract::kTimeout, value);
  if (seconds < 0.001)  // counted in milliseconds: less would be 0, failing every wait at once
    throw Error(fmt::format("DDL_TIMEOUT={} would fail every wait at once: it is in seconds and must be at least 0.001", value),
                "set e.g. DDL_TIMEOUT=300");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

std::chrono::milliseconds timeout_from_environment() {
  const char* value = std::getenv(contract::kTimeout.name);
  if (value == nullptr || *value == '\0') return std::chrono::milliseconds(static_cast<long long>(contract::kTimeout.fallback * 1000));
  return timeout_setting(value);
}

}  // namespace ddl
