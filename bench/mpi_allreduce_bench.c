/* Allreduce bandwidth of MPI_Allreduce (float32, sum, in place), in the style of nccl-tests; the
 * peer of ddl_allreduce_bench (bench/allreduce_bench.cpp), with the same flags, method and table.
 *
 *   mpirun -np 2 build/bench/mpi_allreduce_bench
 *   mpirun --allow-run-as-root --oversubscribe -np 4 build/bench/mpi_allreduce_bench -e 256M
 *
 * For every size from -b to -e (bytes, doubling): a barrier, warm-up iterations, a barrier, then
 * timed iterations of MPI_Allreduce(MPI_IN_PLACE, ...). Timed iterations per size =
 * clamp(--budget / size, --min-iters, -n); warm-up iterations = min(-w, that). time = mean over the timed iterations, max over ranks;
 * algbw = size / time; busbw = algbw * 2(n-1)/n. #wrong: after the timed loop the buffer is
 * refilled with element i = (rank + 1) + i % 8, allreduced once more and compared with the exact
 * sum n(n+1)/2 + n(i % 8); total over ranks. Any wrong element makes the program exit 1. The
 * timed loop reduces a buffer of zeros, so that in-place sums stay finite. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_size(const char* text, unsigned long long* out) {
  char* end = NULL;
  double v = strtod(text, &end);
  unsigned long long mult = 1;
  if (end == text || v < 0) return 0;
  if (*end == 'K' || *end == 'k')
    mult = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1ull << 30, ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return 0;
  *out = (unsigned long long)(v * (double)mult);
  return 1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: mpirun -np N mpi_allreduce_bench [-b MINBYTES] [-e MAXBYTES] [-w WARMUP] [-n MAXITERS]\n"
          "                 [--min-iters N] [--budget BYTES]\n"
          "  defaults: -b 4 -e 64M -w 10 -n 200 --min-iters 5 --budget 1G\n"
          "  timed iterations per size = clamp(budget / size, min-iters, MAXITERS)\n");
}

static void fill(float* buf, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) buf[i] = (float)(rank + 1 + (int)(i % 8));
}

int main(int argc, char** argv) {
  unsigned long long min_bytes = 4, max_bytes = 64ull << 20, budget = 1ull << 30;
  int warmup = 10, max_iters = 200, min_iters = 5;
  int rank = 0, size = 1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    int ok = 1;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      if (rank == 0) usage();
      MPI_Finalize();
      return 0;
    }
    if (i + 1 >= argc)
      ok = 0;
    else if (strcmp(a, "-b") == 0 || strcmp(a, "--minbytes") == 0)
      ok = parse_size(argv[++i], &min_bytes);
    else if (strcmp(a, "-e") == 0 || strcmp(a, "--maxbytes") == 0)
      ok = parse_size(argv[++i], &max_bytes);
    else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup") == 0)
      warmup = atoi(argv[++i]);
    else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0)
      max_iters = atoi(argv[++i]);
    else if (strcmp(a, "--min-iters") == 0)
      min_iters = atoi(argv[++i]);
    else if (strcmp(a, "--budget") == 0)
      ok = parse_size(argv[++i], &budget);
    else
      ok = 0;
    if (!ok) {
      if (rank == 0) usage();
      MPI_Finalize();
      return 2;
    }
  }
  min_bytes = min_bytes / 4 * 4;
  if (min_bytes < 4) min_bytes = 4;
  if (max_bytes < min_bytes || warmup < 0 || max_iters < 1 || min_iters < 1 || min_iters > max_iters) {
    if (rank == 0) usage();
    MPI_Finalize();
    return 2;
  }

  const size_t max_count = (size_t)(max_bytes / 4);
  float* buf = malloc(max_count * sizeof(float));
  if (buf == NULL) {
    fprintf(stderr, "mpi_allreduce_bench: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const double bus_factor = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  if (rank == 0) {
    printf("# impl mpi, ranks %d, float32 sum, in place, warmup min(%d, iters), iters clamp(%llu/size, %d, %d)\n", size, warmup, budget,
           min_iters, max_iters);
    printf("# %12s %12s %6s %12s %12s %12s %8s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    fflush(stdout);
  }

  long long total_wrong = 0;
  double busbw_sum = 0;
  int sizes = 0;
  for (unsigned long long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = (size_t)(bytes / 4);
    unsigned long long by_budget = budget / bytes;
    int iters = (int)(by_budget > (unsigned long long)max_iters ? (unsigned long long)max_iters : by_budget);
    if (iters < min_iters) iters = min_iters;
    memset(buf, 0, count * sizeof(float)); /* zeros: in-place sums stay finite */

    MPI_Barrier(MPI_COMM_WORLD);
    for (int it = 0; it < warmup && it < iters; ++it) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double t1 = MPI_Wtime();
    double us = (t1 - t0) * 1e6 / iters;
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    fill(buf, count, rank);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long long wrong = 0;
    const int base = size * (size + 1) / 2;
    for (size_t i = 0; i < count; ++i)
      if (buf[i] != (float)(base + size * (int)(i % 8))) ++wrong;
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    total_wrong += wrong;

    const double algbw = (double)bytes / (us * 1e3);
    const double busbw = algbw * bus_factor;
    busbw_sum += busbw;
    ++sizes;
    if (rank == 0) {
      printf("  %12llu %12zu %6d %12.2f %12.4f %12.4f %8lld\n", bytes, count, iters, us, algbw, busbw, wrong);
      fflush(stdout);
    }
  }
  /* Barrier latency: max_iters barriers after as many warm-up ones, timed like one size. */
  for (int it = 0; it < warmup; ++it) MPI_Barrier(MPI_COMM_WORLD);
  const double b0 = MPI_Wtime();
  for (int it = 0; it < max_iters; ++it) MPI_Barrier(MPI_COMM_WORLD);
  double barrier_us = (MPI_Wtime() - b0) * 1e6 / max_iters;
  MPI_Allreduce(MPI_IN_PLACE, &barrier_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("# barrier time(us): %.2f (%d iters)\n", barrier_us, max_iters);
    printf("# avg busbw (GB/s): %.4f\n", sizes ? busbw_sum / sizes : 0.0);
    printf("# check: %s (%lld wrong elements)\n", total_wrong == 0 ? "ok" : "FAILED", total_wrong);
    fflush(stdout);
  }
  free(buf);
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
