// glibc's memcpy against libddl's copy_bytes (runtime/src/core/copy_bytes.cpp) at the sizes
// libddl copies: one gradient into the fusion buffer, one shared-memory slot. Single thread,
// source and destination reused (in cache up to the cache's size), GB/s = bytes / time.
//
//   build/bench/ddl_copy_bench [--seconds 0.2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/src/core/copy_bytes.hpp"

namespace {

template <typename Copy>
double gigabytes_per_second(Copy copy, char* to, const char* from, size_t bytes, double seconds) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 3; ++i) copy(to, from, bytes);  // warm-up
  size_t rounds = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 16; ++i) {
      copy(to, from, bytes);
      asm volatile("" ::: "memory");  // every copy happens
    }
    rounds += 16;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return static_cast<double>(bytes) * static_cast<double>(rounds) / elapsed / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: ddl_copy_bench [--seconds 0.2]\n");
      return 2;
    }
  }
  std::printf("# %10s %14s %16s %8s\n", "bytes", "memcpy(GB/s)", "copy_bytes(GB/s)", "ratio");
  for (size_t bytes = 1024; bytes <= (size_t{16} << 20); bytes *= 2) {
    std::vector<char> from(bytes, 1), to(bytes, 2);
    const double libc =
        gigabytes_per_second([](void* t, const void* f, size_t n) { std::memcpy(t, f, n); }, to.data(), from.data(), bytes, seconds);
    const double ours = gigabytes_per_second(ddl::runtime::copy_bytes, to.data(), from.data(), bytes, seconds);
    if (std::memcmp(to.data(), from.data(), bytes) != 0) {
      std::fprintf(stderr, "copy_bench: copy_bytes copied wrong bytes at size %zu\n", bytes);
      return 1;
    }
    std::printf("  %10zu %14.2f %16.2f %8.2f\n", bytes, libc, ours, ours / libc);
  }
  return 0;
}
