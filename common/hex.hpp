// Bytes as lowercase hex and back: random tokens, and words that must cross a text-only channel
// byte for byte (a remote host's job).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddl {

std::string to_hex(std::string_view bytes);

// The bytes of `hex`, or nullopt when it is not an even number of lowercase hex digits.
std::optional<std::string> from_hex(std::string_view hex);

}  // namespace ddl
