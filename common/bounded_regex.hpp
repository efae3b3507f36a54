// Whole-text matching of a pattern a user wrote (a site profile's), within a time bound.
#pragma once

#include <chrono>
#include <string>

namespace ddl {

enum class RegexMatch { yes, no, too_slow };

// Whether all of `text` matches the ECMAScript `pattern` (an invalid pattern matches nothing).
// libstdc++'s std::regex backtracks: a pattern of nested repetition ((a|aa)*b) takes time
// exponential in the length of a text it does not match. So the match runs in a child process
// given `budget`: too_slow where it ran out (the child is killed). Where no child can be made,
// it runs here, unbounded.
RegexMatch match_whole_within(const std::string& text, const std::string& pattern, std::chrono::milliseconds budget);

}  // namespace ddl
