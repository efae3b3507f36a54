#include "rendezvous/store_protocol.hpp"

#include <cstring>

namespace ddl::store {

namespace {
template <typename T>
void append_le(std::string& out, T v) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  out.append(bytes, sizeof(T));  // one append: a negotiation round serializes every op's spec
}

template <typename T>
std::optional<T> take_le(std::string_view& rest) {
  if (rest.size() < sizeof(T)) return std::nullopt;
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(rest[i])) << (8 * i);
  rest.remove_prefix(sizeof(T));
  return static_cast<T>(v);
}
}  // namespace

Writer& Writer::u8(uint8_t v) {
  frame_.push_back(static_cast<char>(v));
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  append_le(frame_, v);
  return *this;
}
Writer& Writer::i64(int64_t v) {
  append_le(frame_, static_cast<uint64_t>(v));
  return *this;
}
Writer& Writer::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  frame_.append(s);
  return *this;
}

namespace {
// Writes the body's length into the 4 bytes reserved before it.
void patch_length(std::string& frame) {
  const auto length = static_cast<uint32_t>(frame.size() - 4);
  for (size_t i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
}
}  // namespace

std::string Writer::frame() const {
  std::string out = frame_;
  patch_length(out);
  return out;
}

std::string Writer::take_frame() {
  patch_length(frame_);
  std::string out = std::move(frame_);
  frame_.assign(4, '\0');
  return out;
}

std::optional<uint8_t> Reader::u8() { return take_le<uint8_t>(rest_); }
std::optional<uint32_t> Reader::u32() { return take_le<uint32_t>(rest_); }
std::optional<int64_t> Reader::i64() {
  auto v = take_le<uint64_t>(rest_);
  if (!v) return std::nullopt;
  return static_cast<int64_t>(*v);
}
std::optional<std::string> Reader::str() {
  auto n = u32();
  if (!n || rest_.size() < *n) return std::nullopt;
  std::string s(rest_.substr(0, *n));
  rest_.remove_prefix(*n);
  return s;
}

std::optional<uint32_t> peek_frame_length(std::string_view buf) { return take_le<uint32_t>(buf); }

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Fold every byte pair (and the length difference) into one accumulator; no early exit.
  size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace ddl::store
