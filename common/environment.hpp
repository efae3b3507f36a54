// A process environment as a sorted name -> value map, so launcher logic is a pure function of it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/worker_contract.hpp"

namespace ddl {

using Environment = std::map<std::string, std::string>;

// The environment of this process.
Environment current_environment();
// Whether `name` is a shell variable name: [A-Za-z_][A-Za-z0-9_]*. Checked by hand, in linear
// time: libstdc++'s std::regex recurses once per character matched, and a name of 100,000
// characters (the kernel allows 128 KiB) would overflow the stack.
bool is_variable_name(std::string_view name);
// `text` as a whole number from 0 to `maximum` (digits only), or nullopt: atoi reads "99999999999"
// as 1215752191 or a negative number, and "4x" as 4.
std::optional<long long> whole_number(std::string_view text, long long maximum);
// "NAME=value" strings, in the form execve() takes.
std::vector<std::string> to_envp(const Environment& env);
// The value of `name`, or nullopt when unset (an empty value counts as set).
std::optional<std::string> lookup(const Environment& env, const std::string& name);

// The number in environment variable `name` (`fallback` when unset or empty). Anything but a finite
// number within [minimum, maximum] (nan, inf, "10s", out of range) throws ddl::Error naming the
// variable, so DDL_TIMEOUT and friends mean the same wherever they are read.
double number_from_environment(const char* name, double fallback, double minimum, double maximum);
// The same check of one value of variable `name`.
double number_setting(const std::string& name, const std::string& value, double minimum, double maximum);
// A setting of the worker contract, from the environment (its fallback when unset or empty) or as given.
double number_from_environment(const contract::NumberSetting& setting);
double number_setting(const contract::NumberSetting& setting, const std::string& value);
// DDL_TIMEOUT: seconds, more than 0 and at most a year (default 300).
std::chrono::milliseconds timeout_from_environment();
std::chrono::milliseconds timeout_setting(const std::string& value);

}  // namespace ddl
