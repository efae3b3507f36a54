// A worker program for the libddl integration tests: run under `ddl run -np N`, it checks every
// collective against results it computes itself from the formulas that made each rank's input.
//   collective_checks            every op, dtype and size; submission in different orders
//   collective_checks mismatch   ranks disagree on one op's shape: every rank must get an error
//   collective_checks die K      rank K kills itself mid-allreduce: survivors must get an error
//   collective_checks world      prints what ddl_init found (rank, size, local rank/size, node), then allreduces
//   collective_checks reinit     the same, then ddl_finalize, ddl_init and the allreduces again
//   collective_checks edges PATH edges of the C API (a name not UTF-8, NULL sends, huge counts, a local set release, fork)
// Prints "PASS n checks" (or what failed) and exits 0 when every check held.
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddl/ddl.h"

// LeakSanitizer asks this before its check at exit. A fork()ed child of this multi-threaded program
// skips the check: it would wait forever for an allocator lock that another thread of the parent
// held at the fork (LSan does not support fork() beside threads; 1 run in ~70 hung under load).
static bool g_forked_child = false;
// NOLINTNEXTLINE(bugprone-reserved-identifier): LSan's own name
extern "C" int __lsan_is_turned_off() { return g_forked_child ? 1 : 0; }

namespace {
int g_rank = 0, g_size = 1, g_checks = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok && g_failures++ < 20) std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
}

void require(ddl_status s, const char* what) {
  if (s != DDL_SUCCESS) {
    std::printf("FAIL rank %d: %s returned %s: %s\n", g_rank, what, ddl_status_string(s), ddl_last_error());
    std::exit(1);
  }
}

// Host-side float16/bfloat16 encodings, written independently of libddl's.
uint16_t to_half(double v) {  // exact for the small integers and halves the tests use
  if (v == 0) return 0;
  int e = 0;
  double m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
  uint16_t mant = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | mant);
}
double from_half(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  double m = h & 0x3ff;
  double v = e == 0 ? m / 1024 * std::pow(2, -14) : (1 + m / 1024) * std::pow(2, e - 15);
  return (h & 0x8000) ? -v : v;
}
uint16_t to_bf16(double v) {
  float f = static_cast<float>(v);
  uint32_t b = 0;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);  // exact for the values used
}
double from_bf16(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f = NAN;
  std::memcpy(&f, &b, 4);
  return f;
}

void put(std::vector<char>& buf, ddl_dtype t, size_t i, double v) {
  switch (t) {
    case DDL_FLOAT16: reinterpret_cast<uint16_t*>(buf.data())[i] = to_half(v); break;
    case DDL_BFLOAT16: reinterpret_cast<uint16_t*>(buf.data())[i] = to_bf16(v); break;
    case DDL_FLOAT32: reinterpret_cast<float*>(buf.data())[i] = static_cast<float>(v); break;
    case DDL_FLOAT64: reinterpret_cast<double*>(buf.data())[i] = v; break;
    case DDL_INT32: reinterpret_cast<int32_t*>(buf.data())[i] = static_cast<int32_t>(v); break;
    case DDL_INT64: reinterpret_cast<int64_t*>(buf.data())[i] = static_cast<int64_t>(v); break;
    case DDL_UINT8: reinterpret_cast<uint8_t*>(buf.data())[i] = static_cast<uint8_t>(v); break;
    case DDL_INT8: reinterpret_cast<int8_t*>(buf.data())[i] = static_cast<int8_t>(v); break;
    case DDL_INT16: reinterpret_cast<int16_t*>(buf.data())[i] = static_cast<int16_t>(v); break;
    case DDL_BOOL: reinterpret_cast<bool*>(buf.data())[i] = v != 0; break;
    case DDL_UINT16: reinterpret_cast<uint16_t*>(buf.data())[i] = static_cast<uint16_t>(v); break;
    case DDL_UINT32: reinterpret_cast<uint32_t*>(buf.data())[i] = static_cast<uint32_t>(v); break;
    case DDL_UINT64: reinterpret_cast<uint64_t*>(buf.data())[i] = static_cast<uint64_t>(v); break;
  }
}
double get(const std::vector<char>& buf, ddl_dtype t, size_t i) {
  switch (t) {
    case DDL_FLOAT16: return from_half(reinterpret_cast<const uint16_t*>(buf.data())[i]);
    case DDL_BFLOAT16: return from_bf16(reinterpret_cast<const uint16_t*>(buf.data())[i]);
    case DDL_FLOAT32: return reinterpret_cast<const float*>(buf.data())[i];
    case DDL_FLOAT64: return reinterpret_cast<const double*>(buf.data())[i];
    case DDL_INT32: return reinterpret_cast<const int32_t*>(buf.data())[i];
    case DDL_INT64: return static_cast<double>(reinterpret_cast<const int64_t*>(buf.data())[i]);
    case DDL_UINT8: return reinterpret_cast<const uint8_t*>(buf.data())[i];
    case DDL_INT8: return reinterpret_cast<const int8_t*>(buf.data())[i];
    case DDL_INT16: return reinterpret_cast<const int16_t*>(buf.data())[i];
    case DDL_BOOL: return reinterpret_cast<const bool*>(buf.data())[i] ? 1 : 0;
    case DDL_UINT16: return reinterpret_cast<const uint16_t*>(buf.data())[i];
    case DDL_UINT32: return reinterpret_cast<const uint32_t*>(buf.data())[i];
    case DDL_UINT64: return static_cast<double>(reinterpret_cast<const uint64_t*>(buf.data())[i]);
  }
  return 0;
}

const ddl_dtype kTypes[] = {DDL_FLOAT16, DDL_BFLOAT16, DDL_FLOAT32, DDL_FLOAT64, DDL_INT32, DDL_INT64};
const char* kTypeNames[] = {"f16", "bf16", "f32", "f64", "i32", "i64"};
const ddl_reduce_op kOps[] = {DDL_SUM, DDL_AVERAGE, DDL_MIN, DDL_MAX, DDL_PRODUCT};
const char* kOpNames[] = {"sum", "avg", "min", "max", "prod"};

// Rank r's element i: small integers, so every sum and product is exact in every type.
double input(ddl_reduce_op op, int r, size_t i) {
  if (op == DDL_PRODUCT) return 1 + static_cast<double>((static_cast<size_t>(r) + i) % 2);  // product <= 2^8
  return 1 + static_cast<double>((static_cast<size_t>(r) * 3 + i) % 5);
}

double expected(ddl_reduce_op op, ddl_dtype t, size_t i) {
  double acc = input(op, 0, i);
  for (int r = 1; r < g_size; ++r) {
    double v = input(op, r, i);
    if (op == DDL_SUM || op == DDL_AVERAGE)
      acc += v;
    else if (op == DDL_PRODUCT)
      acc *= v;
    else if (op == DDL_MIN)
      acc = std::min(acc, v);
    else
      acc = std::max(acc, v);
  }
  if (op != DDL_AVERAGE) return acc;
  if (t == DDL_INT32 || t == DDL_INT64) return std::trunc(acc / g_size);
  return acc / g_size;
}

double tolerance(ddl_dtype t, double value) {
  switch (t) {
    case DDL_FLOAT16: return std::fabs(value) * 1e-3 + 1e-3;
    case DDL_BFLOAT16: return std::fabs(value) * 8e-3 + 1e-3;
    case DDL_FLOAT32: return std::fabs(value) * 1e-6;
    default: return 0;
  }
}

void check_allreduces() {
  const size_t sizes[] = {0, 1, 7, 1000003};
  for (size_t ti = 0; ti < 6; ++ti) {
    for (size_t oi = 0; oi < 5; ++oi) {
      for (size_t n : sizes) {
        ddl_dtype t = kTypes[ti];
        ddl_reduce_op op = kOps[oi];
        std::vector<char> send(n * ddl_dtype_size(t) + 1), recv(n * ddl_dtype_size(t) + 1);
        for (size_t i = 0; i < n; ++i) put(send, t, i, input(op, g_rank, i));
        std::string name = std::string("allreduce.") + kTypeNames[ti] + "." + kOpNames[oi] + "." + std::to_string(n);
        require(ddl_allreduce(name.c_str(), send.data(), recv.data(), n, t, op), name.c_str());
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          double want = expected(op, t, i);
          if (std::fabs(get(recv, t, i) - want) > tolerance(t, want)) ++bad;
        }
        check(bad == 0, name + ": " + std::to_string(bad) + " wrong elements");
      }
    }
  }
  // In place, float32 sum of 1M: recv == send.
  std::vector<float> data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(input(DDL_SUM, g_rank, i));
  require(ddl_allreduce("inplace", data.data(), data.data(), data.size(), DDL_FLOAT32, DDL_SUM), "inplace");
  bool ok = true;
  for (size_t i = 0; i < data.size(); ++i) ok = ok && data[i] == static_cast<float>(expected(DDL_SUM, DDL_FLOAT32, i));
  check(ok, "in-place allreduce");
}

// float32 allreduces compressed to float16: exact for small integers, and visibly rounded for a
// value float16 cannot hold (so the compression really happened). Two ops fuse, one runs alone.
void check_fp16_compression() {
  std::vector<float> a(1000), b(3), c{1.0001f};
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(input(DDL_SUM, g_rank, i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(input(DDL_SUM, g_rank, i));
  ddl_handle ha = nullptr, hb = nullptr, hc = nullptr;
  require(ddl_allreduce_flags_async("fp16.a", a.data(), a.data(), a.size(), DDL_FLOAT32, DDL_SUM, DDL_COMPRESS_FP16, &ha), "fp16.a");
  require(ddl_allreduce_flags_async("fp16.b", b.data(), b.data(), b.size(), DDL_FLOAT32, DDL_AVERAGE, DDL_COMPRESS_FP16, &hb), "fp16.b");
  require(ddl_allreduce_flags_async("fp16.c", c.data(), c.data(), 1, DDL_FLOAT32, DDL_SUM, DDL_COMPRESS_FP16, &hc), "fp16.c");
  require(ddl_wait(ha), "wait fp16.a");
  require(ddl_wait(hb), "wait fp16.b");
  require(ddl_wait(hc), "wait fp16.c");
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) ok = ok && a[i] == static_cast<float>(expected(DDL_SUM, DDL_FLOAT32, i));
  check(ok, "fp16-compressed sum");
  ok = true;
  for (size_t i = 0; i < b.size(); ++i)
    ok = ok && std::fabs(b[i] - expected(DDL_AVERAGE, DDL_FLOAT32, i)) < 2e-3 * expected(DDL_AVERAGE, DDL_FLOAT32, i);
  check(ok, "fp16-compressed average");
  check(c[0] == static_cast<float>(g_size), "fp16 compression rounds 1.0001 to 1 before summing");
  float x = 1;
  check(ddl_allreduce_flags_async("fp16.f64", &x, &x, 1, DDL_FLOAT64, DDL_SUM, DDL_COMPRESS_FP16, &ha) == DDL_ERROR_INVALID_ARGUMENT,
        "DDL_COMPRESS_FP16 on float64 is refused");
}

// DDL_BLOCKING: the op is done when the call returns and the handle is NULL; a NULL handle makes
// ddl_barrier_ex blocking; the ops whose results stay with their handle refuse the flag.
void check_blocking_flag() {
  ddl_op_options blocking = DDL_OP_OPTIONS_INIT;
  blocking.flags = DDL_BLOCKING;
  bool ok = true;
  for (int step = 0; step < 20; ++step) {
    std::vector<int32_t> v(3, g_rank + step);
    require(ddl_allreduce_ex("blocking.sum", v.data(), v.data(), v.size(), DDL_INT32, DDL_SUM, &blocking, nullptr), "blocking.sum");
    ok = ok && v == std::vector<int32_t>(3, g_size * (g_size - 1) / 2 + g_size * step);
    require(ddl_barrier_ex(nullptr, nullptr), "blocking barrier_ex");
  }
  check(ok, "DDL_BLOCKING allreduce, twenty times between blocking barriers");
  ddl_handle h = reinterpret_cast<ddl_handle>(1);
  int64_t root_value = g_rank == g_size - 1 ? 42 : -1;
  require(ddl_broadcast_ex("blocking.bcast", &root_value, 1, DDL_INT64, g_size - 1, &blocking, &h), "blocking.bcast");
  check(root_value == 42 && h == nullptr, "DDL_BLOCKING broadcast: done at return, handle set to NULL");
  std::vector<size_t> zeros(static_cast<size_t>(g_size), 0);
  check(ddl_alltoallv_ex("blocking.alltoallv", nullptr, zeros.data(), nullptr, zeros.data(), DDL_INT32, &blocking, &h) ==
                DDL_ERROR_INVALID_ARGUMENT &&
            std::string(ddl_last_error()).find("DDL_BLOCKING applies to") != std::string::npos,
        "DDL_BLOCKING on ddl_alltoallv_ex is refused, naming the functions it applies to");
}

// A CUDA reducescatter of unequal blocks fails on every rank, whatever each lacks (NCCL cannot do
// it; these ranks have no GPU at all); then the host ops go on.
void check_cuda_refusals() {
  if (g_size < 2) return;  // one rank's blocks are always equal
  ddl_op_options cuda = DDL_OP_OPTIONS_INIT;
  cuda.flags = DDL_CUDA_BUFFERS;
  std::vector<size_t> counts(static_cast<size_t>(g_size), 2);
  counts[0] = 3;
  float send[64] = {}, recv[4] = {};
  ddl_handle h = nullptr;
  require(ddl_reducescatter_ex("cuda.rs.unequal", send, recv, counts.data(), DDL_FLOAT32, DDL_SUM, &cuda, &h),
          "unequal CUDA reducescatter");
  // NCCL refuses unequal blocks; without a GPU (these checks run on host memory) no route exists
  // at all, and every rank says so: either way the op fails everywhere, with the reason.
  const ddl_status status = ddl_wait(h);
  const std::string why = ddl_last_error();
  check(status == DDL_ERROR_UNSUPPORTED && (why.find("needs the same count for every rank") != std::string::npos ||
                                            why.find("no GPU is visible") != std::string::npos || why.find("NCCL") != std::string::npos),
        "a CUDA reducescatter of unequal blocks fails on every rank, saying why: " + why);
  float x = 1.0f;
  require(ddl_allreduce("after.cuda.refusal", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "host allreduce after the refusal");
  check(x == static_cast<float>(g_size), "host ops go on after the refused CUDA reducescatter");
}

// An async op whose name is still in flight on this rank is refused by the call that submits it,
// with no handle, for ops with their counts known up front and for those exchanging them
// (allgather-any). Rank 0's first op cannot finish before the barrier, since the other ranks submit
// theirs only after it, so its second submit always finds the first in flight.
void check_refused_at_submit() {
  std::vector<int32_t> v(4, g_rank + 1);
  ddl_handle first = nullptr, gathered = nullptr;
  int32_t mine = g_rank;
  auto submit_both = [&] {
    require(ddl_allreduce_async("refused.allreduce", v.data(), v.data(), v.size(), DDL_INT32, DDL_SUM, &first), "refused.allreduce");
    require(ddl_allgather_any_ex("refused.gather", &mine, 1, DDL_INT32, nullptr, &gathered), "refused.gather");
  };
  // One rank alone may finish its op before the second submission: then the name is free again.
  if (g_rank == 0 && g_size > 1) {
    submit_both();
    std::vector<int32_t> other(4, 0);
    const auto untouched = reinterpret_cast<ddl_handle>(1);
    ddl_handle second = untouched;
    const ddl_status allreduce =
        ddl_allreduce_async("refused.allreduce", other.data(), other.data(), other.size(), DDL_INT32, DDL_SUM, &second);
    const bool named = std::string(ddl_last_error()).find("'refused.allreduce' is already in flight") != std::string::npos;
    check(allreduce == DDL_ERROR_INVALID_ARGUMENT && named && second == untouched,
          "an allreduce named as one in flight is refused when submitted, naming it, with no handle");
    const ddl_status gather = ddl_allgather_any_ex("refused.gather", &mine, 1, DDL_INT32, nullptr, &second);
    check(gather == DDL_ERROR_INVALID_ARGUMENT && second == untouched, "so is an allgather-any, with no handle");
    require(ddl_barrier(), "refused barrier");
  } else {
    if (g_size > 1) require(ddl_barrier(), "refused barrier");
    submit_both();
  }
  require(ddl_wait(first), "refused.allreduce wait");
  check(v == std::vector<int32_t>(4, g_size * (g_size + 1) / 2), "the first op of that name still completes, right");
  std::vector<size_t> counts(static_cast<size_t>(g_size));
  const void* data = nullptr;
  require(ddl_gathered(gathered, counts.data(), &data), "refused.gather gathered");
  bool ranks_in_order = true;
  for (int r = 0; r < g_size; ++r) ranks_in_order = ranks_in_order && counts[r] == 1 && static_cast<const int32_t*>(data)[r] == r;
  require(ddl_wait(gathered), "refused.gather wait");
  check(ranks_in_order, "so does the first allgather-any of that name");
}

// An unnamed op that one rank's libddl refuses at submit (an argument only that rank got wrong) still
// takes its place: the other ranks' op fails with that rank's reason, and the unnamed ops after it pair
// as before, where the refusing rank's next unnamed op had paired with the others' refused one,
// returning its data.
void check_refusal_takes_its_place() {
  if (g_size < 2) return;
  const bool refuses = g_rank == g_size - 1;
  float first = 1.0f;
  ddl_handle h = nullptr;
  const auto no_such_dtype = static_cast<ddl_dtype>(99);
  const ddl_status submitted = ddl_allreduce_ex(nullptr, &first, &first, 1, refuses ? no_such_dtype : DDL_FLOAT32, DDL_SUM, nullptr, &h);
  if (refuses) {
    check(submitted == DDL_ERROR_INVALID_ARGUMENT, "an unknown dtype is refused at submit");
  } else {
    require(submitted, "the unnamed allreduce the last rank refuses");
    const ddl_status status = ddl_wait(h);
    const std::string why = ddl_last_error();
    check(status == DDL_ERROR_INVALID_ARGUMENT && why.find("unknown dtype 99") != std::string::npos,
          "the other ranks' op fails with the refusing rank's reason: " + why);
  }
  float next = static_cast<float>(100 * (g_rank + 1));
  require(ddl_allreduce(nullptr, &next, &next, 1, DDL_FLOAT32, DDL_SUM), "the unnamed allreduce after the refusal");
  check(next == static_cast<float>(100 * g_size * (g_size + 1) / 2), "the next unnamed op pairs with the others' next one");
  check(first == 1.0f, "the refused op's buffer is untouched");
  int32_t value = g_rank == 0 ? 7 : 0;
  const ddl_status broadcast = ddl_broadcast("refused.root", &value, 1, DDL_INT32, refuses ? g_size : 0);
  // A named op takes no place when refused: its name is free at once, for the call made right, which
  // the other ranks' op of that name pairs with.
  if (refuses) {
    check(broadcast == DDL_ERROR_INVALID_ARGUMENT && std::string(ddl_last_error()).find("is not a rank") != std::string::npos,
          std::string("a named op one rank refuses is refused there: ") + ddl_last_error());
    require(ddl_broadcast("refused.root", &value, 1, DDL_INT32, 0), "the named op submitted again");
  } else {
    require(broadcast, "the named broadcast the last rank submits again");
  }
  check(value == 7, "the named op submitted again pairs with the others' op of that name");
  // ddl_allgatherv's own check (send_count against recv_counts) takes the unnamed op's place too.
  std::vector<size_t> counts(static_cast<size_t>(g_size), 1);
  std::vector<float> gathered(static_cast<size_t>(g_size));
  float mine = static_cast<float>(g_rank);
  const ddl_status gatherv = ddl_allgatherv(nullptr, &mine, refuses ? 2 : 1, gathered.data(), counts.data(), DDL_FLOAT32);
  check(gatherv == DDL_ERROR_INVALID_ARGUMENT,
        std::string("an allgatherv whose send_count one rank gets wrong fails on every rank: ") + ddl_last_error());
  float after = static_cast<float>(100 * (g_rank + 1));
  require(ddl_allreduce(nullptr, &after, &after, 1, DDL_FLOAT32, DDL_SUM), "the unnamed allreduce after the allgatherv");
  check(after == static_cast<float>(100 * g_size * (g_size + 1) / 2), "the next unnamed op after it pairs with the others' next one");
}

// From every root: across hosts, a root's local rank decides the path (see hierarchical_collectives).
void check_broadcast_gather_alltoall() {
  for (int root = 0; root < g_size; ++root) {
    for (size_t n : {size_t{0}, size_t{7}, size_t{1000003}}) {
      std::vector<int64_t> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = g_rank == root ? static_cast<int64_t>(i * 7 + root) : -1;
      std::string name = "broadcast." + std::to_string(root) + "." + std::to_string(n);
      require(ddl_broadcast(name.c_str(), buf.data(), n, DDL_INT64, root), name.c_str());
      bool ok = true;
      for (size_t i = 0; i < n; ++i) ok = ok && buf[i] == static_cast<int64_t>(i * 7 + root);
      check(ok, name);
    }
  }
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}}) {
    std::vector<double> send(n), recv(n * static_cast<size_t>(g_size));
    for (size_t i = 0; i < n; ++i) send[i] = g_rank * 100.0 + static_cast<double>(i);
    std::string name = "allgather." + std::to_string(n);
    require(ddl_allgather(name.c_str(), send.data(), recv.data(), n, DDL_FLOAT64), name.c_str());
    bool ok = true;
    for (int r = 0; r < g_size; ++r)
      for (size_t i = 0; i < n; ++i) ok = ok && recv[static_cast<size_t>(r) * n + i] == r * 100.0 + static_cast<double>(i);
    check(ok, name);
  }
  // allgatherv: rank r contributes r elements (rank 0 none).
  std::vector<size_t> counts;
  size_t total = 0;
  for (int r = 0; r < g_size; ++r) {
    counts.push_back(static_cast<size_t>(r));
    total += static_cast<size_t>(r);
  }
  std::vector<int32_t> send(static_cast<size_t>(g_rank), g_rank), recv(total + 1, -1);
  require(ddl_allgatherv("allgatherv", send.data(), send.size(), recv.data(), counts.data(), DDL_INT32), "allgatherv");
  bool ok = true;
  size_t at = 0;
  for (int r = 0; r < g_size; ++r)
    for (int k = 0; k < r; ++k) ok = ok && recv[at++] == r;
  check(ok && recv[total] == -1, "allgatherv");
  // alltoall: block j sent by rank r holds r*1000 + j*10 + k.
  const size_t block = 3;
  std::vector<int64_t> out(block * static_cast<size_t>(g_size)), in(out.size());
  for (int j = 0; j < g_size; ++j)
    for (size_t k = 0; k < block; ++k) out[static_cast<size_t>(j) * block + k] = g_rank * 1000 + j * 10 + static_cast<int64_t>(k);
  require(ddl_alltoall("alltoall", out.data(), in.data(), block, DDL_INT64), "alltoall");
  ok = true;
  for (int j = 0; j < g_size; ++j)
    for (size_t k = 0; k < block; ++k)
      ok = ok && in[static_cast<size_t>(j) * block + k] == j * 1000 + g_rank * 10 + static_cast<int64_t>(k);
  check(ok, "alltoall");
  // In place (send == recv, which ddl.h allows): each transport must read every block before it is
  // overwritten; Gloo receives a peer's block while it still sends its own.
  for (int round = 0; round < 5; ++round) {
    std::vector<int64_t> both(4096 * static_cast<size_t>(g_size));
    const size_t per_rank = both.size() / static_cast<size_t>(g_size);
    for (size_t i = 0; i < both.size(); ++i) both[i] = g_rank * 100000000LL + static_cast<int64_t>(i);
    require(ddl_alltoall("alltoall.inplace", both.data(), both.data(), per_rank, DDL_INT64), "alltoall in place");
    ok = true;
    for (int j = 0; j < g_size; ++j)
      for (size_t k = 0; k < per_rank; ++k)
        ok = ok && both[static_cast<size_t>(j) * per_rank + k] == j * 100000000LL + static_cast<int64_t>(g_rank * per_rank + k);
    check(ok, "alltoall in place (send == recv)");
  }
  require(ddl_barrier(), "barrier");
}

// ddl_allgather_ex and ddl_alltoall_ex on a process set of the world's last ranks (all but rank 0,
// where there are two or more), async and DDL_BLOCKING; the older forms above are calls of them.
void check_gather_and_alltoall_on_a_set() {
  std::vector<int> members;
  for (int r = g_size > 1 ? 1 : 0; r < g_size; ++r) members.push_back(r);
  ddl_process_set set = nullptr;
  require(ddl_process_set_create(members.data(), static_cast<int>(members.size()), &set), "set of the last ranks");
  int set_rank = -1, set_size = 0;
  require(ddl_process_set_rank(set, &set_rank), "set rank");
  require(ddl_process_set_size(set, &set_size), "set size");
  ddl_op_options on_set = DDL_OP_OPTIONS_INIT;
  on_set.process_set = set;
  int32_t mine[2] = {g_rank * 10, g_rank * 10 + 1};
  if (set_rank < 0) {
    int32_t out[2] = {};
    ddl_handle h = nullptr;
    check(ddl_allgather_ex("set.allgather", mine, out, 2, DDL_INT32, &on_set, &h) == DDL_ERROR_INVALID_ARGUMENT,
          "ddl_allgather_ex on a set this rank is not a member of is refused");
  } else {
    std::vector<int32_t> gathered(2 * static_cast<size_t>(set_size), -1);
    ddl_handle h = nullptr;
    require(ddl_allgather_ex("set.allgather", mine, gathered.data(), 2, DDL_INT32, &on_set, &h), "set.allgather");
    require(ddl_wait(h), "set.allgather wait");
    bool ok = true;
    for (int i = 0; i < set_size; ++i)
      ok = ok && gathered[2 * static_cast<size_t>(i)] == members[static_cast<size_t>(i)] * 10 &&
           gathered[2 * static_cast<size_t>(i) + 1] == members[static_cast<size_t>(i)] * 10 + 1;
    check(ok, "ddl_allgather_ex on a set: every member's block, in set rank order");
    ddl_op_options blocking = on_set;
    blocking.flags = DDL_BLOCKING;
    std::vector<int64_t> out(static_cast<size_t>(set_size)), in(out.size(), -1);
    for (int j = 0; j < set_size; ++j) out[static_cast<size_t>(j)] = set_rank * 100 + j;
    require(ddl_alltoall_ex("set.alltoall", out.data(), in.data(), 1, DDL_INT64, &blocking, nullptr), "set.alltoall");
    ok = true;
    for (int j = 0; j < set_size; ++j) ok = ok && in[static_cast<size_t>(j)] == j * 100 + set_rank;
    check(ok, "DDL_BLOCKING ddl_alltoall_ex on a set: block j comes from set rank j");
    ddl_op_options cuda = on_set;
    cuda.flags = DDL_CUDA_BUFFERS;
    check(ddl_alltoall_ex("set.alltoall.cuda", out.data(), in.data(), 1, DDL_INT64, &cuda, &h) == DDL_ERROR_UNSUPPORTED &&
              std::string(ddl_last_error()).find("ddl_alltoallv_ex") != std::string::npos,
          "ddl_alltoall_ex of CUDA buffers is refused at once, naming ddl_alltoallv_ex");
  }
  require(ddl_process_set_destroy(set), "destroy the set of the last ranks");
}

void check_one_step_in_rank_dependent_order(int step);

// Ranks submit the same 50 named ops in different orders (odd ranks backwards), async, for three
// steps: from the second step on they are announced through the response cache.
void check_submission_order() {
  for (int step = 0; step < 3; ++step) check_one_step_in_rank_dependent_order(step);
}

void check_one_step_in_rank_dependent_order(int step) {
  const int n = 50;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(10));
  std::vector<ddl_handle> handles(n);
  for (int k = 0; k < n; ++k) {
    int op = g_rank % 2 ? n - 1 - k : k;
    for (size_t i = 0; i < 10; ++i) bufs[static_cast<size_t>(op)][i] = static_cast<float>(op + g_rank);
    std::string name = "order." + std::to_string(op);
    require(ddl_allreduce_async(name.c_str(), bufs[static_cast<size_t>(op)].data(), bufs[static_cast<size_t>(op)].data(), 10, DDL_FLOAT32,
                                DDL_SUM, &handles[static_cast<size_t>(op)]),
            "allreduce_async");
  }
  bool ok = true;
  for (int op = 0; op < n; ++op) {
    int done = 0;
    require(ddl_test(handles[static_cast<size_t>(op)], &done), "test");
    require(ddl_wait(handles[static_cast<size_t>(op)]), "wait");
    float want = static_cast<float>(op * g_size + g_size * (g_size - 1) / 2);
    for (float v : bufs[static_cast<size_t>(op)]) ok = ok && v == want;
  }
  check(ok, "ops submitted in different orders on different ranks, step " + std::to_string(step));
}

int run_mismatch() {
  std::vector<float> buf(static_cast<size_t>(g_rank == g_size - 1 ? 5 : 4), 1.0f);
  ddl_status s = ddl_allreduce("grad/w1", buf.data(), buf.data(), buf.size(), DDL_FLOAT32, DDL_SUM);
  std::printf("mismatch status %s: %s\n", ddl_status_string(s), ddl_last_error());
  // The runtime keeps working after a mismatch.
  float x = 1;
  require(ddl_allreduce("after", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "allreduce after a mismatch");
  check(x == static_cast<float>(g_size), "allreduce after a mismatch");
  return s == DDL_ERROR_MISMATCH ? 0 : 1;
}

// `victim` is killed (SIGKILL), or frozen (SIGSTOP: alive, but it never answers again), at step 3.
int run_die(int victim, int signal) {
  ::signal(SIGTERM, SIG_IGN);  // let the runtime, not ddl run's fail-fast, end the survivors
  std::vector<float> buf(1 << 16, 1.0f);
  for (int step = 0;; ++step) {
    if (g_rank == victim && step == 3) ::kill(::getpid(), signal);
    std::string name = "step." + std::to_string(step);
    ddl_status s = ddl_allreduce(name.c_str(), buf.data(), buf.data(), buf.size(), DDL_FLOAT32, DDL_MAX);
    if (s != DDL_SUCCESS) {
      std::printf("survivor rank %d: %s: %s\n", g_rank, ddl_status_string(s), ddl_last_error());
      std::fflush(stdout);
      // Frozen victim: the other survivor must reach its own deadline too, not see this one leave
      // first (a peer failure) because its wait began a little later on a loaded machine.
      if (signal == SIGSTOP && s == DDL_ERROR_TIMEOUT) ::sleep(2);
      std::_Exit(3);
    }
  }
}

// Each rank makes a set of all ranks under a key of its own, so none ever meets another: every
// rank must get an error after the set's 2 s, not the store's own time-out.
int run_lonely_set() {
  std::vector<int> ranks(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) ranks[static_cast<size_t>(r)] = r;
  const std::string key = "lonely." + std::to_string(g_rank);
  const auto start = std::chrono::steady_clock::now();
  ddl_process_set set = nullptr;
  const ddl_status s = ddl_process_set_create_among(ranks.data(), g_size, key.c_str(), 2.0, &set);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("lonely set status %s after %.0f s: %s\n", ddl_status_string(s), took, ddl_last_error());
  return s != DDL_SUCCESS ? 0 : 1;
}

// Rank 0 finalizes at once, the others `late` seconds later: rank 0's wait must end within
// DDL_TIMEOUT, naming them, and every rank must still get out.
int run_late_finalize(int late) {
  float x = 1;
  require(ddl_allreduce("before.finalize", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "an op before");
  if (g_rank != 0) ::sleep(static_cast<unsigned>(late));
  const auto start = std::chrono::steady_clock::now();
  const ddl_status s = ddl_finalize();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("finalize status %s after %.0f s: %s\n", ddl_status_string(s), took, s == DDL_SUCCESS ? "" : ddl_last_error());
  return 0;
}

// Process sets made wrong on some ranks (3 ranks): every rank gets an error, none crashes or hangs,
// and the world's next set still works.
int run_set_edges() {
  std::vector<int> all(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) all[static_cast<size_t>(r)] = r;
  // No place for the handle on rank 0 alone: every rank fails this create, and the next pairs up.
  ddl_process_set set = nullptr;
  const ddl_status null_out = ddl_process_set_create(all.data(), g_size, g_rank == 0 ? nullptr : &set);
  check(null_out == (g_rank == 0 ? DDL_ERROR_INVALID_ARGUMENT : DDL_ERROR_MISMATCH),
        "a create with a NULL output on rank 0 fails everywhere");
  require(ddl_process_set_create(all.data(), g_size, &set), "the next create");
  float x = 1;
  ddl_op_options on_set = DDL_OP_OPTIONS_INIT;
  on_set.process_set = set;
  on_set.flags = DDL_BLOCKING;
  require(ddl_allreduce_ex("set.op", &x, &x, 1, DDL_FLOAT32, DDL_SUM, &on_set, nullptr), "an op on it");
  check(x == static_cast<float>(g_size), "the op on the set is right");
  require(ddl_process_set_destroy(set), "destroy it");
  // Under a millisecond is refused: as 0 ms the store gave up at once while Gloo waited for ever.
  check(ddl_process_set_create_among(all.data(), g_size, "tiny", 0.0004, &set) == DDL_ERROR_INVALID_ARGUMENT,
        "a timeout of 0.4 ms is refused");
  // Rank 0 asks for {0, 1}, the others for {0, 1, 2}: one key, segments of two sizes (a SIGBUS).
  const int members = g_rank == 0 ? 2 : g_size;
  const ddl_status s = ddl_process_set_create_among(all.data(), members, "disagree", 3.0, &set);
  std::printf("disagreeing set status %s\n", ddl_status_string(s));
  check(s != DDL_SUCCESS, "members that disagree on the list fail");
  return 0;
}

// Edges of the C API that hostile programs found (run with DDL_TIMELINE set, 2+ ranks):
int run_edges(const char* second_timeline) {
  // An op name that is not UTF-8 is the program's bytes: the timeline writes it replaced, and the
  // world goes on (it broke, reported as a lost peer).
  float x = 1;
  require(ddl_allreduce("grad/\xff\xfe", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "a name that is not UTF-8");
  check(x == static_cast<float>(g_size), "its allreduce is right");
  // A rank whose own count is 0 may give NULL as its send buffer (refused, the others waited).
  std::vector<size_t> counts(static_cast<size_t>(g_size), 1);
  counts[0] = 0;
  std::vector<int32_t> gathered(static_cast<size_t>(g_size - 1), -1);
  int32_t mine = g_rank;
  ddl_handle agv = nullptr;
  require(ddl_allgatherv_ex("edges.agv", g_rank == 0 ? nullptr : &mine, gathered.data(), counts.data(), DDL_INT32, nullptr, &agv),
          "allgatherv_ex with a NULL send of 0 elements");
  require(ddl_wait(agv), "its wait");
  for (int r = 1; r < g_size; ++r) check(gathered[static_cast<size_t>(r - 1)] == r, "allgatherv_ex gathers the others");
  // Counts whose bytes do not fit in a size_t are refused, not wrapped to a few bytes and "done".
  std::vector<float> small(8, 1.0f);
  const size_t huge = (size_t{1} << 62) + 4;
  check(ddl_allreduce("edges.huge", small.data(), small.data(), huge, DDL_FLOAT32, DDL_SUM) == DDL_ERROR_INVALID_ARGUMENT &&
            std::string(ddl_last_error()).find("more bytes than memory can hold") != std::string::npos,
        "an allreduce of 2^62+4 floats is refused");
  check(ddl_allgather("edges.huge", small.data(), small.data(), (size_t{1} << 61), DDL_FLOAT32) == DDL_ERROR_INVALID_ARGUMENT,
        "an allgather whose output would be 2^61 floats per rank is refused");
  check(small == std::vector<float>(8, 1.0f), "and nothing was written");
  // A set made by its members is released locally: rank 0 releases it and goes on to a world op
  // that the others join only before they release it (waiting for them deadlocked).
  std::vector<int> all(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) all[static_cast<size_t>(r)] = r;
  ddl_process_set set = nullptr;
  require(ddl_process_set_create_among(all.data(), g_size, "edges.members", 0.0, &set), "create_among");
  float y = 1;
  if (g_rank == 0) {
    require(ddl_process_set_destroy(set), "destroy the members' set first");
    require(ddl_allreduce("edges.after", &y, &y, 1, DDL_FLOAT32, DDL_SUM), "the world op after");
  } else {
    require(ddl_allreduce("edges.after", &y, &y, 1, DDL_FLOAT32, DDL_SUM), "the world op before");
    require(ddl_process_set_destroy(set), "destroy the members' set after");
  }
  check(y == static_cast<float>(g_size), "the world op after a local release is right");
  // A fork()ed child that exits runs the exit handlers: it must leave the timeline alone.
  const pid_t child = ::fork();
  if (child == 0) {
    g_forked_child = true;
    std::exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  // Restarting the timeline at a path for rank 0 only ends this rank's own file too.
  require(ddl_timeline_start(second_timeline), "ddl_timeline_start");
  require(ddl_allreduce("edges.last", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "the last op");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  require(ddl_init(), "ddl_init");
  require(ddl_rank(&g_rank), "ddl_rank");
  require(ddl_size(&g_size), "ddl_size");
  std::string mode = argc > 1 ? argv[1] : "all";
  int rc = 0;
  if (mode == "world" || mode == "reinit") {
    int local_rank = -1, local_size = -1, node_rank = -1;
    require(ddl_local_rank(&local_rank), "ddl_local_rank");
    require(ddl_local_size(&local_size), "ddl_local_size");
    require(ddl_node_rank(&node_rank), "ddl_node_rank");
    std::printf("world rank %d size %d local %d/%d node %d\n", g_rank, g_size, local_rank, local_size, node_rank);
    check_allreduces();
    check_broadcast_gather_alltoall();
  } else if (mode == "mismatch")
    rc = run_mismatch();
  else if (mode == "die")
    rc = run_die(argc > 2 ? std::atoi(argv[2]) : 1, SIGKILL);
  else if (mode == "freeze")
    rc = run_die(argc > 2 ? std::atoi(argv[2]) : 1, SIGSTOP);
  else if (mode == "lonely_set")
    rc = run_lonely_set();
  else if (mode == "edges")
    rc = run_edges(argc > 2 ? argv[2] : "edges.json");
  else if (mode == "set_edges")
    rc = run_set_edges();
  else if (mode == "late_finalize")
    return run_late_finalize(argc > 2 ? std::atoi(argv[2]) : 5);
  else {
    check_allreduces();
    check_fp16_compression();
    check_blocking_flag();
    check_cuda_refusals();
    check_refused_at_submit();
    check_refusal_takes_its_place();
    check_broadcast_gather_alltoall();
    check_gather_and_alltoall_on_a_set();
    check_submission_order();
  }
  require(ddl_finalize(), "ddl_finalize");
  if (mode == "reinit") {
    // A second world in the same process: nothing of the first (store or PMIx keys, the
    // shared-memory segment) may leak into it.
    require(ddl_init(), "ddl_init again");
    check_allreduces();
    require(ddl_finalize(), "ddl_finalize again");
  }
  if (g_failures == 0 && rc == 0) std::printf("PASS %d checks on rank %d of %d\n", g_checks, g_rank, g_size);
  return g_failures == 0 ? rc : 1;
}
