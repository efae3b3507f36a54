#include "common/bounded_regex.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <regex>
#include <thread>

namespace ddl {

namespace {

RegexMatch match_here(const std::string& text, const std::string& pattern) {
  try {
    return std::regex_match(text, std::regex(pattern)) ? RegexMatch::yes : RegexMatch::no;
  } catch (const std::exception&) {  // an invalid pattern, or limits std::regex itself detects
    return RegexMatch::no;
  }
}

}  // namespace

RegexMatch match_whole_within(const std::string& text, const std::string& pattern, std::chrono::milliseconds budget) {
  const pid_t child = ::fork();
  if (child < 0) return match_here(text, pattern);
  if (child == 0) ::_exit(match_here(text, pattern) == RegexMatch::yes ? 0 : 1);  // _exit: no atexit, no stdio flush
  // A match takes microseconds: polled at first often, then less.
  const auto deadline = std::chrono::steady_clock::now() + budget;
  auto pause = std::chrono::microseconds(20);
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? RegexMatch::yes : RegexMatch::no;
    if (done < 0 && errno != EINTR) return match_here(text, pattern);  // reaped elsewhere: match here instead
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  ::kill(child, SIGKILL);
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  return RegexMatch::too_slow;
}

}  // namespace ddl
