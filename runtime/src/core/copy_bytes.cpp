#include "runtime/src/core/copy_bytes.hpp"

#include <cstdint>
#include <cstring>

namespace ddl::runtime {

namespace {
// Outside [kLibcBelow, kLibcFrom) glibc's memcpy is as fast or faster: below, it moves vectors
// itself; from kLibcFrom up it streams large blocks past the cache. (Its `rep movsb` range ends
// below 128 KiB in a loop over hot buffers, but a 2-rank 512 KiB allreduce, whose 256 KiB copies
// go to and from shared memory another core just touched, takes 270 us with memcpy and 80 us
// without: every copy that fits a shared-memory slot is done here.)
constexpr size_t kLibcBelow = 2 << 10;
constexpr size_t kLibcFrom = 4 << 20;
constexpr size_t kBlock = 64;
}  // namespace

void copy_bytes(void* to, const void* from, size_t bytes) {
  if (bytes == 0) return;  // the pointers of an empty buffer may be null
  if (bytes < kLibcBelow || bytes >= kLibcFrom) {
    std::memcpy(to, from, bytes);
    return;
  }
  auto* d = static_cast<char*>(to);
  const auto* s = static_cast<const char*>(from);
  size_t at = 0;
  // A copy of a constant 64 bytes is expanded inline into vector loads and stores.
  for (; at + kBlock <= bytes; at += kBlock) __builtin_memcpy(d + at, s + at, kBlock);
  if (at < bytes) std::memcpy(d + at, s + at, bytes - at);  // under 64 bytes: memcpy's short path
}

bool bytes_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

void move_bytes(void* to, const void* from, size_t bytes) {
  if (bytes == 0) return;
  if (bytes_overlap(to, bytes, from, bytes))
    std::memmove(to, from, bytes);
  else
    copy_bytes(to, from, bytes);
}

}  // namespace ddl::runtime
