#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "runtime/src/core/copy_bytes.hpp"

using ddl::runtime::copy_bytes;
using ddl::runtime::move_bytes;

namespace {
std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
  return v;
}
}  // namespace

TEST_CASE("copy_bytes copies exactly the bytes asked for, at any length and alignment") {
  const auto source = pattern(4096 + 64, 7);
  for (size_t offset : {0, 1, 3, 8, 17}) {
    for (size_t bytes = 0; bytes <= 2200; bytes += bytes < 100 || bytes >= 2040 ? 1 : 61) {
      auto target = pattern(source.size(), 200);
      const auto before = target;
      copy_bytes(target.data() + offset, source.data() + (offset * 5) % 13, bytes);
      for (size_t i = 0; i < target.size(); ++i) {
        const bool inside = i >= offset && i < offset + bytes;
        const uint8_t expected = inside ? source[(offset * 5) % 13 + i - offset] : before[i];
        if (target[i] != expected) FAIL("offset ", offset, ", ", bytes, " bytes: byte ", i, " is wrong");
      }
    }
  }
}

TEST_CASE("copy_bytes copies large blocks, below and above the size where it hands over to memcpy") {
  for (size_t bytes :
       {size_t{4096}, size_t{65536} + 5, (size_t{256} << 10) + 3, (size_t{4} << 20) - 1, size_t{4} << 20, (size_t{4} << 20) + 11}) {
    const auto source = pattern(bytes, 3);
    std::vector<uint8_t> target(bytes + 2, 0xAB);
    copy_bytes(target.data() + 1, source.data(), bytes);
    CHECK(std::equal(source.begin(), source.end(), target.begin() + 1));
    CHECK(target.front() == 0xAB);
    CHECK(target.back() == 0xAB);
  }
}

TEST_CASE("move_bytes copies between separate buffers and moves within one, either direction") {
  const auto source = pattern(8192, 11);
  std::vector<uint8_t> separate(8192, 0);
  move_bytes(separate.data(), source.data(), source.size());
  CHECK(separate == source);
  for (long shift : {-4096L, -64L, -1L, 1L, 64L, 4096L}) {
    auto buffer = pattern(16384, 5);
    const auto before = buffer;
    const size_t from = 6000, bytes = 5000;
    move_bytes(buffer.data() + from + shift, buffer.data() + from, bytes);
    CHECK(std::equal(before.begin() + from, before.begin() + from + bytes, buffer.begin() + from + shift));
  }
  move_bytes(nullptr, nullptr, 0);  // an empty buffer may have no address
  copy_bytes(nullptr, nullptr, 0);
}
