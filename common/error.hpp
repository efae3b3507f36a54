// The one exception type of ddl: a message saying what went wrong and a hint saying how to fix it.
// cli/main.cpp is the one place that catches it, prints "ddl: error: ..." and "hint: ...", and
// picks the exit status from its type (the launcher's types, not this one, know about exit codes).
#pragma once

#include <stdexcept>
#include <string>

namespace ddl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string hint = {}) : std::runtime_error(visible(message)), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }

 private:
  // A NUL that a quoted value holds (a hostfile's line) as \0: what() is a C string, which ended there.
  static std::string visible(const std::string& message) {
    std::string text;
    for (char c : message) {
      if (c == '\0')
        text += "\\0";
      else
        text += c;
    }
    return text;
  }

  std::string hint_;
};

// The transports' and the store client's errors, by kind, so that libddl reports DDL_ERROR_TIMEOUT
// or DDL_ERROR_PEER_FAILED from the type and never from the words of a message.
// A peer did not answer within the timeout (DDL_TIMEOUT).
class TimeoutError : public Error {
 public:
  using Error::Error;
};
// A peer is gone: its connection broke or it closed it.
class PeerLostError : public Error {
 public:
  using Error::Error;
};

// A mistake in what the user typed (ddl exits with status 2).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddl
