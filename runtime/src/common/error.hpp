// The one exception type of ddl: a message saying what went wrong, a hint saying how to fix it,
// and the exit status ddl ends with. cli/main.cpp is the one place that catches it and prints
// "ddl: error: ..." and "hint: ...".
#pragma once

#include <stdexcept>
#include <string>

namespace ddl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string hint = {}, int exit_code = 1)
      : std::runtime_error(message), hint_(std::move(hint)), exit_code_(exit_code) {}
  const std::string& hint() const noexcept { return hint_; }
  int exit_code() const noexcept { return exit_code_; }

 private:
  std::string hint_;
  int exit_code_;
};

// A mistake in what the user typed: ddl exits with status 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message, std::string hint = {}) : Error(message, std::move(hint), 2) {}
};

}  // namespace ddl
