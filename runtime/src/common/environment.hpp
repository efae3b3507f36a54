// A process environment as a sorted name -> value map, so launcher logic is a pure function of it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddl {

using Environment = std::map<std::string, std::string>;

// The environment of this process.
Environment current_environment();
// "NAME=value" strings, in the form execve() takes.
std::vector<std::string> to_envp(const Environment& env);
// The value of `name`, or nullopt when unset (an empty value counts as set).
std::optional<std::string> lookup(const Environment& env, const std::string& name);

}  // namespace ddl
