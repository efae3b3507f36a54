// libddl on CUDA buffers (NCCL). Run alone or under `ddl run` (one GPU per rank).
//   gpu_checks          allreduce, broadcast, allgather, reducescatter and alltoallv of device buffers
//                       on a stream, checked on the host (also a blocking allreduce, and one waited
//                       for by another thread); exits 77 (ctest: skipped) with a message when no GPU
//                       is visible
//   gpu_checks no-gpu   without a GPU: CUDA ops fail with DDL_ERROR_UNSUPPORTED, host ops still work
//   gpu_checks shared   the same checks on ranks that share one GPU (ddl run --share-gpus), or with
//                       DDL_CUDA_VIA_HOST=1: NCCL allows one rank per GPU, so CUDA ops go through
//                       host memory, where unequal reducescatter blocks work too
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddl/ddl.h"

namespace {

int g_rank = 0, g_size = 1, g_failures = 0;
bool g_via_host = false;  // CUDA ops go through host memory (mode "shared")

void require(ddl_status s, const char* what) {
  if (s != DDL_SUCCESS) {
    std::printf("FAIL rank %d: %s: %s: %s\n", g_rank, what, ddl_status_string(s), ddl_last_error());
    std::exit(1);
  }
}

void require_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::printf("FAIL rank %d: %s: %s\n", g_rank, what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  }
}

// Once ddl_wait returns, the op's work on its stream is finished (ddl.h: "the handle completes
// when the result is in recv"). The stream does not synchronize with the default stream, so the
// cudaMemcpy that reads the result would not wait for unfinished work either.
void check_stream_idle(cudaStream_t stream, const char* op) {
  check(cudaStreamQuery(stream) == cudaSuccess, std::string(op) + ": work still on the stream after ddl_wait returned");
}

template <typename T>
T* device_copy_of(const std::vector<T>& host) {
  T* d = nullptr;
  require_cuda(cudaMalloc(&d, sizeof(T) * std::max<size_t>(host.size(), 1)), "cudaMalloc");
  require_cuda(cudaMemcpy(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), "copy in");
  require_cuda(cudaDeviceSynchronize(), "copy in done");
  return d;
}

template <typename T>
std::vector<T> host_copy_of(const T* d, size_t n) {
  std::vector<T> host(n);
  require_cuda(cudaMemcpy(host.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost), "copy out");
  return host;
}

// Rank r's input element i is r + i; rank r receives block r of the sum (3 elements per rank); then
// unequal blocks, which ncclReduceScatter cannot do, are refused on every rank (with 2 ranks or
// more), or through host memory reduced as well.
void check_reducescatter(cudaStream_t stream) {
  const size_t per_rank = 3, n = per_rank * static_cast<size_t>(g_size);
  std::vector<float> in(n + 1);  // the unequal blocks below take one element more
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(g_rank) + static_cast<float>(i);
  float* dsend = device_copy_of(in);
  float* drecv = device_copy_of(std::vector<float>(per_rank + 1, -1.0f));
  std::vector<size_t> counts(static_cast<size_t>(g_size), per_rank);
  ddl_op_options o = DDL_OP_OPTIONS_INIT;
  o.flags = DDL_CUDA_BUFFERS;
  o.stream = stream;
  ddl_handle h = nullptr;
  require(ddl_reducescatter_ex("gpu.rs", dsend, drecv, counts.data(), DDL_FLOAT32, DDL_SUM, &o, &h), "reducescatter_ex CUDA");
  require(ddl_wait(h), "wait reducescatter");
  check_stream_idle(stream, "reducescatter");
  const std::vector<float> got = host_copy_of(drecv, per_rank);
  const float rank_sum = static_cast<float>(g_size * (g_size - 1) / 2);
  bool ok = true;
  for (size_t i = 0; i < per_rank; ++i) {
    const size_t global = static_cast<size_t>(g_rank) * per_rank + i;
    ok = ok && got[i] == rank_sum + static_cast<float>(g_size) * static_cast<float>(global);
  }
  check(ok, "CUDA reducescatter sum");
  if (g_size > 1) {  // one rank's blocks are always equal
    counts[0] += 1;
    require(ddl_reducescatter_ex("gpu.rs.unequal", dsend, drecv, counts.data(), DDL_FLOAT32, DDL_SUM, &o, &h), "submit");
    if (g_via_host) {
      require(ddl_wait(h), "wait unequal reducescatter");
      const size_t mine = counts[static_cast<size_t>(g_rank)], offset = g_rank == 0 ? 0 : per_rank * static_cast<size_t>(g_rank) + 1;
      const std::vector<float> block = host_copy_of(drecv, mine);
      bool right = true;
      for (size_t i = 0; i < mine; ++i) right = right && block[i] == rank_sum + static_cast<float>(g_size) * static_cast<float>(offset + i);
      check(right, "a CUDA reducescatter of unequal blocks through host memory");
    } else {
      check(ddl_wait(h) == DDL_ERROR_UNSUPPORTED && std::string(ddl_last_error()).find("same count") != std::string::npos,
            "a CUDA reducescatter of unequal blocks fails on every rank, saying why");
    }
  }
  cudaFree(dsend);
  cudaFree(drecv);
}

// Rank r sends d + 1 elements to rank d, each 100 * r + d; then a rank that expects another count
// than its peer sends fails the op on every rank (DDL_ERROR_MISMATCH), and the next op still works.
void check_alltoallv(cudaStream_t stream) {
  const auto ranks = static_cast<size_t>(g_size);
  std::vector<size_t> send_counts(ranks), recv_counts(ranks, static_cast<size_t>(g_rank) + 1);
  std::vector<int32_t> out;
  for (size_t d = 0; d < ranks; ++d) {
    send_counts[d] = d + 1;
    out.insert(out.end(), d + 1, 100 * g_rank + static_cast<int32_t>(d));
  }
  int32_t* dsend = device_copy_of(out);
  int32_t* drecv = device_copy_of(std::vector<int32_t>(ranks * (static_cast<size_t>(g_rank) + 1), -1));
  ddl_op_options o = DDL_OP_OPTIONS_INIT;
  o.flags = DDL_CUDA_BUFFERS;
  o.stream = stream;
  ddl_handle h = nullptr;
  require(ddl_alltoallv_ex("gpu.a2av", dsend, send_counts.data(), drecv, recv_counts.data(), DDL_INT32, &o, &h), "alltoallv_ex CUDA");
  require(ddl_wait(h), "wait alltoallv");
  check_stream_idle(stream, "alltoallv");
  std::vector<int32_t> expected;
  for (size_t r = 0; r < ranks; ++r)
    expected.insert(expected.end(), static_cast<size_t>(g_rank) + 1, 100 * static_cast<int32_t>(r) + g_rank);
  check(host_copy_of(drecv, expected.size()) == expected, "CUDA alltoallv with counts that differ by rank");

  if (g_rank == 0) recv_counts[0] += 1;  // rank 0 expects one more element from itself than it sends
  const ddl_status s = ddl_alltoallv_ex("gpu.a2av.mismatch", dsend, send_counts.data(), drecv, recv_counts.data(), DDL_INT32, &o, &h);
  check(s == DDL_SUCCESS && ddl_wait(h) == DDL_ERROR_MISMATCH, "a CUDA alltoallv with mismatched counts fails on every rank");
  float x = 1.0f;
  require(ddl_allreduce("gpu.after.mismatch", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "host allreduce after the mismatch");
  check(x == static_cast<float>(g_size), "host allreduce after the CUDA alltoallv mismatch");
  cudaFree(dsend);
  cudaFree(drecv);
}

// DDL_BLOCKING with CUDA buffers: this thread enqueues the op on `stream` and returns once the GPU
// has finished it (no handle), twenty times in a row, behind a copy still queued on the stream.
void check_blocking(cudaStream_t stream) {
  const size_t n = 1000;
  std::vector<double> host(n, static_cast<double>(g_rank + 1));
  double* dev = device_copy_of(std::vector<double>(n, 0.0));
  ddl_op_options o = DDL_OP_OPTIONS_INIT;
  o.flags = DDL_CUDA_BUFFERS | DDL_BLOCKING;
  o.stream = stream;
  bool ok = true;
  for (int step = 0; step < 20 && ok; ++step) {
    require_cuda(cudaMemcpyAsync(dev, host.data(), n * sizeof(double), cudaMemcpyHostToDevice, stream), "copy in");
    ddl_handle h = reinterpret_cast<ddl_handle>(1);
    require(ddl_allreduce_ex(nullptr, dev, dev, n, DDL_FLOAT64, DDL_SUM, &o, &h), "blocking CUDA allreduce_ex");
    ok = h == nullptr && cudaStreamQuery(stream) == cudaSuccess;
    ok = ok && host_copy_of(dev, n) == std::vector<double>(n, static_cast<double>(g_size * (g_size + 1) / 2));
  }
  check(ok, "DDL_BLOCKING CUDA allreduce: done on the GPU at return, handle NULL, right sums");
  cudaFree(dev);
}

// An async CUDA op waited for by another thread, one that never chose a GPU (the torch.distributed
// backend's completer thread waits so): ddl_wait runs the rounds there, which see the op's event
// complete; the result must be in place and the stream idle when it returns.
void check_wait_from_another_thread(cudaStream_t stream) {
  const size_t n = 4096;
  float* dev = device_copy_of(std::vector<float>(n, static_cast<float>(g_rank + 1)));
  bool ok = true;
  for (int step = 0; step < 20 && ok; ++step) {
    ddl_handle h = nullptr;
    require(ddl_allreduce_cuda_async("gpu.waited.elsewhere", dev, dev, n, DDL_FLOAT32, DDL_MAX, stream, &h), "allreduce_cuda_async");
    ddl_status waited = DDL_ERROR_INTERNAL;
    std::thread waiter([&] { waited = ddl_wait(h); });
    waiter.join();
    require(waited, "ddl_wait from another thread");
    ok = cudaStreamQuery(stream) == cudaSuccess && host_copy_of(dev, n) == std::vector<float>(n, static_cast<float>(g_size));
  }
  check(ok, "async CUDA allreduce waited for by another thread: done on the GPU at return, right results");
  cudaFree(dev);
}

int run_on_gpu() {
  cudaStream_t stream = nullptr;
  require_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t n = 1 << 20;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((g_rank + 1) * (i % 7));
  float* dev = nullptr;
  require_cuda(cudaMalloc(&dev, n * sizeof(float)), "cudaMalloc");
  require_cuda(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy in");
  require_cuda(cudaDeviceSynchronize(), "copy in done");  // a pageable copy may return before its DMA ends
  ddl_handle h = nullptr;
  require(ddl_allreduce_cuda_async("gpu.sum", dev, dev, n, DDL_FLOAT32, DDL_SUM, stream, &h), "allreduce_cuda_async");
  require(ddl_wait(h), "wait allreduce");
  check_stream_idle(stream, "allreduce");
  require_cuda(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), "copy out");
  const float ranks_sum = static_cast<float>(g_size * (g_size + 1) / 2);
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && host[i] == ranks_sum * static_cast<float>(i % 7);
  check(ok, "CUDA allreduce sum of 1M floats");

  // Out of place, into a buffer of NaNs, with an odd count: every element must be written
  // (NCCL's ncclAvg on one rank left the tail unwritten).
  const size_t odd = 4913;
  float* avg = nullptr;
  require_cuda(cudaMalloc(&avg, odd * sizeof(float)), "cudaMalloc");
  require_cuda(cudaMemset(avg, 0xFF, odd * sizeof(float)), "cudaMemset");
  for (size_t i = 0; i < odd; ++i) host[i] = static_cast<float>((g_rank + 1) * (i % 7));
  require_cuda(cudaMemcpy(dev, host.data(), odd * sizeof(float), cudaMemcpyHostToDevice), "copy in");
  require_cuda(cudaDeviceSynchronize(), "copy in done");
  require(ddl_allreduce_cuda_async("gpu.avg", dev, avg, odd, DDL_FLOAT32, DDL_AVERAGE, stream, &h), "allreduce_cuda_async average");
  require(ddl_wait(h), "wait average");
  std::vector<float> means(odd);
  require_cuda(cudaMemcpy(means.data(), avg, odd * sizeof(float), cudaMemcpyDeviceToHost), "copy out");
  size_t wrong = 0;
  for (size_t i = 0; i < odd; ++i) {
    const float want = ranks_sum / static_cast<float>(g_size) * static_cast<float>(i % 7);
    if (!(std::fabs(means[i] - want) <= 1e-5f * (1.0f + std::fabs(want)))) ++wrong;
  }
  check(wrong == 0, "CUDA allreduce average of 4913 floats out of place: " + std::to_string(wrong) + " elements wrong");

  std::vector<int64_t> b(7, g_rank == 0 ? 42 : -1);
  int64_t* db = nullptr;
  require_cuda(cudaMalloc(&db, 7 * sizeof(int64_t)), "cudaMalloc");
  require_cuda(cudaMemcpy(db, b.data(), 7 * sizeof(int64_t), cudaMemcpyHostToDevice), "copy in");
  require_cuda(cudaDeviceSynchronize(), "copy in done");
  require(ddl_broadcast_cuda_async("gpu.bcast", db, 7, DDL_INT64, 0, stream, &h), "broadcast_cuda_async");
  require(ddl_wait(h), "wait broadcast");
  check_stream_idle(stream, "broadcast");
  require_cuda(cudaMemcpy(b.data(), db, 7 * sizeof(int64_t), cudaMemcpyDeviceToHost), "copy out");
  check(b == std::vector<int64_t>(7, 42), "CUDA broadcast");

  double mine = g_rank * 10.0;
  double *dsend = nullptr, *drecv = nullptr;
  require_cuda(cudaMalloc(&dsend, sizeof(double)), "cudaMalloc");
  require_cuda(cudaMalloc(&drecv, sizeof(double) * static_cast<size_t>(g_size)), "cudaMalloc");
  require_cuda(cudaMemcpy(dsend, &mine, sizeof(double), cudaMemcpyHostToDevice), "copy in");
  require_cuda(cudaDeviceSynchronize(), "copy in done");
  require(ddl_allgather_cuda_async("gpu.gather", dsend, drecv, 1, DDL_FLOAT64, stream, &h), "allgather_cuda_async");
  require(ddl_wait(h), "wait allgather");
  check_stream_idle(stream, "allgather");
  std::vector<double> all(static_cast<size_t>(g_size));
  require_cuda(cudaMemcpy(all.data(), drecv, sizeof(double) * all.size(), cudaMemcpyDeviceToHost), "copy out");
  for (int r = 0; r < g_size; ++r) check(all[static_cast<size_t>(r)] == r * 10.0, "CUDA allgather");
  check_reducescatter(stream);
  check_alltoallv(stream);
  check_blocking(stream);
  check_wait_from_another_thread(stream);
  return g_failures == 0 ? 0 : 1;
}

int run_without_gpu() {
  float x = 1;
  ddl_handle h = nullptr;
  require(ddl_allreduce_cuda_async("gpu.sum", &x, &x, 1, DDL_FLOAT32, DDL_SUM, nullptr, &h), "submit");
  ddl_status s = ddl_wait(h);
  std::printf("cuda op without a GPU: %s: %s\n", ddl_status_string(s), ddl_last_error());
  check(s == DDL_ERROR_UNSUPPORTED, "a CUDA op without a GPU is DDL_ERROR_UNSUPPORTED");
  ddl_op_options blocking = DDL_OP_OPTIONS_INIT;  // run by this thread's own rounds: fails the same, no hang
  blocking.flags = DDL_CUDA_BUFFERS | DDL_BLOCKING;
  s = ddl_allreduce_ex("gpu.sum.blocking", &x, &x, 1, DDL_FLOAT32, DDL_SUM, &blocking, nullptr);
  check(s == DDL_ERROR_UNSUPPORTED, "a blocking CUDA op without a GPU is DDL_ERROR_UNSUPPORTED");
  require(ddl_allreduce("host.after", &x, &x, 1, DDL_FLOAT32, DDL_SUM), "host allreduce after the CUDA failure");
  check(x == static_cast<float>(g_size), "host allreduce after the CUDA failure");
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool no_gpu_mode = mode == "no-gpu";
  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);
  if (!no_gpu_mode && (rc != cudaSuccess || devices == 0)) {
    std::printf("SKIPPED: no GPU visible (%s); the gpu-labelled tests need one\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 77;
  }
  require(ddl_init(), "ddl_init");
  require(ddl_rank(&g_rank), "ddl_rank");
  require(ddl_size(&g_size), "ddl_size");
  g_via_host = mode == "shared";
  int result = no_gpu_mode ? run_without_gpu() : run_on_gpu();
  require(ddl_finalize(), "ddl_finalize");
  if (result == 0) std::printf("PASS rank %d of %d\n", g_rank, g_size);
  return result;
}
