// The one exception type of ddl: a message saying what went wrong and a hint saying how to fix it.
// cli/main.cpp is the one place that catches it, prints "ddl: error: ..." and "hint: ...", and
// picks the exit status from its type (the launcher's types, not this one, know about exit codes).
#pragma once

#include <stdexcept>
#include <string>

namespace ddl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string hint = {}) : std::runtime_error(message), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }

 private:
  std::string hint_;
};

// A mistake in what the user typed (ddl exits with status 2).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddl
