// Tensor fusion in libddl: one "training step" submits many small named allreduces at once (as a
// framework does with the gradients of a model) and then waits for all of them.
//
//   ddl run -np 2 -- build/bench/ddl_fusion_bench                        # fused (the default)
//   DDL_FUSION_THRESHOLD=0 ddl run -np 2 -- build/bench/ddl_fusion_bench # every tensor alone
//
// A step: ddl_allreduce_async of --tensors float32 tensors of --floats elements each (in place, sum,
// tensor t named "grad.<t>"), then ddl_wait on every handle. With --as-ddl-torch each op is what
// ddl.torch submits for a gradient: named "allreduce.grad.<t>" (Horovod's names, past std::string's
// inline room) and with its shape, through ddl_allreduce_ex. --warmup steps, then --steps timed
// steps, each timed on every rank from its first submit to its last wait (one barrier precedes
// the timed loop, none separates the steps). Reported: step time in ms, the mean over the timed steps (max over ranks), and the
// fastest step (max over ranks of each rank's fastest). #wrong: after the timed steps every tensor
// is refilled with element j of tensor t = (rank + 1) + (t + j) % 8, one more step is run, and
// elements that differ from the exact sum n(n+1)/2 + n((t + j) % 8) are counted over all ranks;
// any makes the program exit 1. bench/fusion_compare.py parses the table, which has the same
// columns as bench/torch_fusion_bench.py's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddl/ddl.h"

namespace {

void check(ddl_status status, const char* what) {
  if (status != DDL_SUCCESS) {
    std::fprintf(stderr, "fusion_bench: %s failed: %s: %s\n", what, ddl_status_string(status), ddl_last_error());
    std::exit(1);
  }
}

void usage() {
  std::fprintf(stderr,
               "usage: ddl run -np N -- ddl_fusion_bench [--tensors 1000] [--floats 1024] [--warmup 3] [--steps 20] [--as-ddl-torch]\n");
}

}  // namespace

int main(int argc, char** argv) {
  int tensors = 1000, floats = 1024, warmup = 3, steps = 20;
  bool as_ddl_torch = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      return 0;
    }
    if (a == "--as-ddl-torch") {
      as_ddl_torch = true;
      continue;
    }
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    int v = std::atoi(argv[++i]);
    if (a == "--tensors")
      tensors = v;
    else if (a == "--floats")
      floats = v;
    else if (a == "--warmup")
      warmup = v;
    else if (a == "--steps")
      steps = v;
    else {
      usage();
      return 2;
    }
  }
  if (tensors < 1 || floats < 1 || warmup < 0 || steps < 1) {
    usage();
    return 2;
  }

  check(ddl_init(), "ddl_init");
  int rank = 0, size = 1;
  check(ddl_rank(&rank), "ddl_rank");
  check(ddl_size(&size), "ddl_size");

  std::vector<std::vector<float>> grads(tensors, std::vector<float>(floats));
  std::vector<std::string> names;
  names.reserve(tensors);
  for (int t = 0; t < tensors; ++t) names.push_back((as_ddl_torch ? "allreduce.grad." : "grad.") + std::to_string(t));
  const long long shape[1] = {floats};
  ddl_op_options options = DDL_OP_OPTIONS_INIT;
  options.shape = shape;
  options.ndim = 1;
  auto fill = [&] {
    for (int t = 0; t < tensors; ++t)
      for (int j = 0; j < floats; ++j) grads[t][j] = static_cast<float>(rank + 1 + (t + j) % 8);
  };
  std::vector<ddl_handle> handles(tensors);
  auto step = [&] {
    for (int t = 0; t < tensors; ++t)
      check(ddl_allreduce_ex(names[t].c_str(), grads[t].data(), grads[t].data(), floats, DDL_FLOAT32, DDL_SUM,
                             as_ddl_torch ? &options : nullptr, &handles[t]),
            "ddl_allreduce_ex");
    for (int t = 0; t < tensors; ++t) check(ddl_wait(handles[t]), "ddl_wait");
  };

  const char* threshold = std::getenv("DDL_FUSION_THRESHOLD");
  const char* cycle = std::getenv("DDL_CYCLE_TIME_MS");
  if (rank == 0) {
    std::printf("# impl libddl, ranks %d, %d tensors x %d float32, DDL_FUSION_THRESHOLD=%s, DDL_CYCLE_TIME_MS=%s, warmup %d%s\n", size,
                tensors, floats, threshold && *threshold ? threshold : "(default 64 MiB)", cycle && *cycle ? cycle : "(default 1)", warmup,
                as_ddl_torch ? ", ops as ddl.torch submits them (long names, shapes)" : "");
    std::printf("# %9s %9s %6s %12s %12s %8s\n", "tensors", "floats", "steps", "step(ms)", "min(ms)", "#wrong");
    std::fflush(stdout);
  }

  fill();
  for (int s = 0; s < warmup; ++s) step();
  check(ddl_barrier(), "ddl_barrier");
  double total_ms = 0, min_ms = 1e300;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total_ms += ms;
    min_ms = std::min(min_ms, ms);
  }
  double times[2] = {total_ms / steps, min_ms};
  check(ddl_allreduce("fusion_bench.time", times, times, 2, DDL_FLOAT64, DDL_MAX), "time max-allreduce");

  fill();
  step();
  int64_t wrong = 0;
  const int base = size * (size + 1) / 2;
  for (int t = 0; t < tensors; ++t)
    for (int j = 0; j < floats; ++j)
      if (grads[t][j] != static_cast<float>(base + size * ((t + j) % 8))) ++wrong;
  check(ddl_allreduce("fusion_bench.wrong", &wrong, &wrong, 1, DDL_INT64, DDL_SUM), "#wrong allreduce");

  if (rank == 0) {
    std::printf("  %9d %9d %6d %12.3f %12.3f %8lld\n", tensors, floats, steps, times[0], times[1], static_cast<long long>(wrong));
    std::printf("# check: %s (%lld wrong elements)\n", wrong == 0 ? "ok" : "FAILED", static_cast<long long>(wrong));
    std::fflush(stdout);
  }
  check(ddl_finalize(), "ddl_finalize");
  return wrong == 0 ? 0 : 1;
}
