// Allreduce bandwidth of libddl (float32, sum, in place), in the style of nccl-tests.
//
//   ddl run -np 2 -- build/bench/ddl_allreduce_bench
//   ddl run -np 4 -- build/bench/ddl_allreduce_bench -b 4 -e 256M -w 10 -n 200
//
// For every size from -b to -e (bytes, doubling; K/M/G suffixes are powers of 1024): a barrier,
// warm-up iterations, a barrier, then timed iterations of the blocking ddl_allreduce. The number
// of timed iterations is clamp(--budget / size, --min-iters, -n), so big sizes run fewer; warm-up
// iterations are min(-w, timed iterations). Reported
// per size: time (us, the mean over the timed iterations, the maximum over ranks), algbw =
// size / time (GB/s, 1e9 bytes), busbw = algbw * 2(n-1)/n (nccl-tests' definition), and #wrong:
// after the timed loop every rank refills the buffer with element i = (rank + 1) + i % 8, runs one
// more allreduce and counts elements that differ from the exact sum n(n+1)/2 + n(i % 8); the
// column is the total over ranks. Any wrong element makes the program exit 1. The timed loop
// reduces a buffer of zeros, so that in-place sums stay finite however many iterations run.
// With --async every timed and warm-up iteration is ddl_allreduce_async followed at once by ddl_wait
// of its handle instead: the cost of an async op waited for at once (a Python face's async op and
// synchronize), against the blocking call's.
//
// Each size uses one fixed op name ("allreduce_bench.<bytes>"): the blocking calls finish before
// the next is submitted, so a name is never in flight twice. The table (printed by rank 0) has
// the same columns as those of mpi_allreduce_bench.c and torch_allreduce_bench.py, which
// bench/allreduce_compare.py parses.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddl/ddl.h"

namespace {

void check(ddl_status status, const char* what) {
  if (status != DDL_SUCCESS) {
    std::fprintf(stderr, "allreduce_bench: %s failed: %s: %s\n", what, ddl_status_string(status), ddl_last_error());
    std::exit(1);
  }
}

bool parse_size(const char* text, uint64_t& out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) return false;
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1ull << 30, ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  out = static_cast<uint64_t>(v * static_cast<double>(mult));
  return true;
}

void usage() {
  std::fprintf(stderr,
               "usage: ddl run -np N -- ddl_allreduce_bench [-b MINBYTES] [-e MAXBYTES] [-w WARMUP] [-n MAXITERS]\n"
               "                 [--min-iters N] [--budget BYTES] [--async]\n"
               "  defaults: -b 4 -e 64M -w 10 -n 200 --min-iters 5 --budget 1G\n"
               "  timed iterations per size = clamp(budget / size, min-iters, MAXITERS)\n");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t min_bytes = 4, max_bytes = 64ull << 20, budget = 1ull << 30;
  int warmup = 10, max_iters = 200, min_iters = 5;
  bool async = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    bool ok = true;
    if (a == "-b" || a == "--minbytes")
      ok = parse_size(next(), min_bytes);
    else if (a == "-e" || a == "--maxbytes")
      ok = parse_size(next(), max_bytes);
    else if (a == "-w" || a == "--warmup")
      warmup = std::atoi(next());
    else if (a == "-n" || a == "--iters")
      max_iters = std::atoi(next());
    else if (a == "--min-iters")
      min_iters = std::atoi(next());
    else if (a == "--budget")
      ok = parse_size(next(), budget);
    else if (a == "--async")
      async = true;
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else
      ok = false;
    if (!ok) {
      usage();
      return 2;
    }
  }
  min_bytes = std::max<uint64_t>(4, min_bytes / 4 * 4);
  if (max_bytes < min_bytes || warmup < 0 || max_iters < 1 || min_iters < 1 || min_iters > max_iters) {
    usage();
    return 2;
  }

  check(ddl_init(), "ddl_init");
  int rank = 0, size = 1;
  check(ddl_rank(&rank), "ddl_rank");
  check(ddl_size(&size), "ddl_size");

  const size_t max_count = max_bytes / 4;
  std::vector<float> buf(max_count);
  const double bus_factor = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  if (rank == 0) {
    std::printf("# impl libddl%s, ranks %d, float32 sum, in place, warmup min(%d, iters), iters clamp(%llu/size, %d, %d)\n",
                async ? " (ddl_allreduce_async + ddl_wait)" : "", size, warmup, static_cast<unsigned long long>(budget), min_iters,
                max_iters);
    std::printf("# %12s %12s %6s %12s %12s %12s %8s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    std::fflush(stdout);
  }

  long long total_wrong = 0;
  double busbw_sum = 0;
  int sizes = 0;
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / 4;
    const std::string name = "allreduce_bench." + std::to_string(bytes);
    uint64_t by_budget = budget / bytes;
    const int iters = static_cast<int>(std::min<uint64_t>(max_iters, std::max<uint64_t>(min_iters, by_budget)));
    std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(count), 0.0f);  // stays finite in place

    auto allreduce = [&](const char* what) {
      if (!async) return check(ddl_allreduce(name.c_str(), buf.data(), buf.data(), count, DDL_FLOAT32, DDL_SUM), what);
      ddl_handle handle = nullptr;
      check(ddl_allreduce_async(name.c_str(), buf.data(), buf.data(), count, DDL_FLOAT32, DDL_SUM, &handle), what);
      check(ddl_wait(handle), what);
    };
    check(ddl_barrier(), "ddl_barrier");
    for (int it = 0; it < std::min(warmup, iters); ++it) allreduce("warm-up allreduce");
    check(ddl_barrier(), "ddl_barrier");
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) allreduce("allreduce");
    const auto t1 = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
    check(ddl_allreduce("allreduce_bench.time", &us, &us, 1, DDL_FLOAT64, DDL_MAX), "time max-allreduce");

    // Correctness: one more allreduce of a known pattern.
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 8));
    check(ddl_allreduce(name.c_str(), buf.data(), buf.data(), count, DDL_FLOAT32, DDL_SUM), "check allreduce");
    int64_t wrong = 0;
    const int base = size * (size + 1) / 2;
    for (size_t i = 0; i < count; ++i)
      if (buf[i] != static_cast<float>(base + size * static_cast<int>(i % 8))) ++wrong;
    check(ddl_allreduce("allreduce_bench.wrong", &wrong, &wrong, 1, DDL_INT64, DDL_SUM), "#wrong allreduce");
    total_wrong += wrong;

    const double algbw = static_cast<double>(bytes) / (us * 1e3);  // bytes/us/1e3 = GB/s
    const double busbw = algbw * bus_factor;
    busbw_sum += busbw;
    ++sizes;
    if (rank == 0) {
      std::printf("  %12llu %12zu %6d %12.2f %12.4f %12.4f %8lld\n", static_cast<unsigned long long>(bytes), count, iters, us, algbw, busbw,
                  static_cast<long long>(wrong));
      std::fflush(stdout);
    }
  }
  // Barrier latency: max_iters blocking barriers after as many warm-up ones, timed like one size.
  for (int it = 0; it < warmup; ++it) check(ddl_barrier(), "warm-up barrier");
  const auto b0 = std::chrono::steady_clock::now();
  for (int it = 0; it < max_iters; ++it) check(ddl_barrier(), "barrier");
  double barrier_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - b0).count() / max_iters;
  check(ddl_allreduce("allreduce_bench.time", &barrier_us, &barrier_us, 1, DDL_FLOAT64, DDL_MAX), "time max-allreduce");
  if (rank == 0) {
    std::printf("# barrier time(us): %.2f (%d iters)\n", barrier_us, max_iters);
    std::printf("# avg busbw (GB/s): %.4f\n", sizes ? busbw_sum / sizes : 0.0);
    std::printf("# check: %s (%lld wrong elements)\n", total_wrong == 0 ? "ok" : "FAILED", total_wrong);
    std::fflush(stdout);
  }
  check(ddl_finalize(), "ddl_finalize");
  return total_wrong == 0 ? 0 : 1;
}
