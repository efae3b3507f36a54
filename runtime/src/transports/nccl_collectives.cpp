#include "runtime/src/transports/gpu_collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "runtime/src/core/dtype.hpp"
#include "runtime/src/transports/nccl_library.hpp"

#if DDL_WITH_NCCL
#include <cuda_runtime.h>

#include "runtime/src/transports/cuda_device.hpp"
#endif

namespace ddl::runtime {

namespace {
constexpr const char* kViaHostAsked = "DDL_CUDA_VIA_HOST=1 asks for it";
}

#if DDL_WITH_NCCL

namespace {

// NCCL's entry points: loaded at run time (nccl_library.hpp), present once a communicator exists.
const NcclLibrary::Api& nccl() { return nccl_api(); }

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess && rc != ncclInProgress) throw Error(fmt::format("{}: {}", what, nccl().GetErrorString(rc)));
}

ncclDataType_t nccl_type(ddl_dtype t) {
  switch (t) {
    case DDL_FLOAT16: return ncclFloat16;
    case DDL_BFLOAT16: return ncclBfloat16;
    case DDL_FLOAT32: return ncclFloat32;
    case DDL_FLOAT64: return ncclFloat64;
    case DDL_INT32: return ncclInt32;
    case DDL_INT64: return ncclInt64;
    case DDL_UINT8: return ncclUint8;
    case DDL_INT8: return ncclInt8;
    case DDL_INT16: return ncclFloat16;  // moved, never reduced: the C API refuses int16 CUDA allreduces
    case DDL_BOOL: return ncclUint8;     // the moved-only types: their bytes
    case DDL_UINT16: return ncclFloat16;
    case DDL_UINT32: return ncclUint32;
    case DDL_UINT64: return ncclUint64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ddl_reduce_op op) {
  switch (op) {
    case DDL_SUM: return ncclSum;
    case DDL_AVERAGE: return ncclAvg;
    case DDL_MIN: return ncclMin;
    case DDL_MAX: return ncclMax;
    case DDL_PRODUCT: return ncclProd;
  }
  return ncclSum;
}

class NcclCollectives final : public GpuCollectives {
 public:
  // A communicator of every rank on `device`, from rank 0's `id`. Every rank has one or none has:
  // a rank whose init failed alone would leave the others running the next CUDA ops' host steps
  // (alltoallv's count check) without it.
  // Each rank also says whether its GPU has memory pools (fusion buffers come from one): CUDA
  // allreduces fuse only where every rank's does, so that all group them alike.
  NcclCollectives(Collectives& host, int device, const ncclUniqueId& id) : device_(device), size_(host.size()) {
    ncclResult_t rc = ncclInternalError;
    std::string why_not;
    int pools = 0;
    try {
      current_.select(device_);  // ncclCommInitRank binds the communicator to the current GPU
      rc = nccl().CommInitRank(&comm_, host.size(), id, host.rank());
      if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_) != cudaSuccess) pools = 0;
      current_.restore();
    } catch (const Error& e) {
      current_.restore();
      why_not = e.what();
    }
    const bool made = why_not.empty() && (rc == ncclSuccess || rc == ncclInProgress);
    const std::vector<std::string> made_by = host.allgather_bytes(made ? (pools != 0 ? "1p" : "1") : "0");
    if (std::find(made_by.begin(), made_by.end(), "0") != made_by.end()) {
      if (made) nccl().CommAbort(comm_);
      comm_ = nullptr;
      if (!why_not.empty()) throw Error(why_not);
      if (!made) check_nccl(rc, "ncclCommInitRank");
      throw Error("another rank could not create its NCCL communicator; its own error says why");
    }
    fuses_ = std::all_of(made_by.begin(), made_by.end(), [](const std::string& m) { return m == "1p"; });
  }

  ~NcclCollectives() override {
    if (comm_ != nullptr) nccl().CommDestroy(comm_);
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  }

  void allreduce(const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op, void* stream) override {
    // NCCL 2.28.9 on one rank leaves the last elements of an out-of-place ncclAvg unwritten (H100:
    // 4097 and 4913 floats, 5000 and 65537 doubles); one rank's average is its sum, which is right.
    if (op == DDL_AVERAGE && size_ == 1) op = DDL_SUM;
    check_nccl(nccl().AllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, static_cast<cudaStream_t>(stream)),
               "ncclAllReduce");
  }
  void broadcast(void* data, size_t count, ddl_dtype dtype, int root, void* stream) override {
    check_nccl(nccl().Broadcast(data, data, count, nccl_type(dtype), root, comm_, static_cast<cudaStream_t>(stream)), "ncclBroadcast");
  }
  void allgather(const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream) override {
    check_nccl(nccl().AllGather(send, recv, count, nccl_type(dtype), comm_, static_cast<cudaStream_t>(stream)), "ncclAllGather");
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, ddl_dtype dtype, ddl_reduce_op op, void* stream) override {
    if (op == DDL_AVERAGE && size_ == 1) op = DDL_SUM;  // as allreduce: one rank's average is its sum
    check_nccl(nccl().ReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), comm_, static_cast<cudaStream_t>(stream)),
               "ncclReduceScatter");
  }
  // NCCL has no alltoallv: one send and one receive per peer, inside the caller's group (group_start),
  // which NCCL runs as one launch without deadlock whatever the order.
  void alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv, const std::vector<size_t>& recv_counts,
                 ddl_dtype dtype, void* stream) override {
    const size_t element = dtype_size(dtype);
    const auto* from = static_cast<const char*>(send);
    auto* to = static_cast<char*>(recv);
    auto* s = static_cast<cudaStream_t>(stream);
    for (int peer = 0; peer < size_; ++peer) {
      const auto p = static_cast<size_t>(peer);
      if (send_counts[p] > 0) check_nccl(nccl().Send(from, send_counts[p], nccl_type(dtype), peer, comm_, s), "ncclSend");
      if (recv_counts[p] > 0) check_nccl(nccl().Recv(to, recv_counts[p], nccl_type(dtype), peer, comm_, s), "ncclRecv");
      from += send_counts[p] * element;
      to += recv_counts[p] * element;
    }
  }
  // From a pool of this GPU's own that keeps what it has (a release threshold of all of it), so a
  // fusion buffer costs no cudaMalloc once the pool holds one as large; other users of the GPU
  // (torch's caching allocator, the device's default pool) are not touched.
  void* buffer(size_t bytes, void* stream) override {
    current_.select(device_);
    cudaError_t rc = pool_ == nullptr ? make_pool() : cudaSuccess;
    void* memory = nullptr;
    if (rc == cudaSuccess) rc = cudaMallocFromPoolAsync(&memory, std::max<size_t>(bytes, 1), pool_, static_cast<cudaStream_t>(stream));
    current_.restore();
    cuda::check(rc, "cannot allocate a fusion buffer on the GPU");
    return memory;
  }
  void release_buffer(void* buffer, void* stream) override {
    current_.select(device_);
    const cudaError_t rc = cudaFreeAsync(buffer, static_cast<cudaStream_t>(stream));
    current_.restore();
    cuda::check(rc, "cannot release a fusion buffer");
  }
  void copy(void* to, const void* from, size_t bytes, void* stream) override {
    if (bytes == 0) return;
    current_.select(device_);
    const cudaError_t rc = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
    current_.restore();
    cuda::check(rc, "cannot copy a GPU buffer to or from the fusion buffer");
  }
  void order_after(void* later, void* earlier) override {
    current_.select(device_);
    cudaEvent_t event = nullptr;
    cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(event, static_cast<cudaStream_t>(earlier));
    if (rc == cudaSuccess) rc = cudaStreamWaitEvent(static_cast<cudaStream_t>(later), event, 0);
    if (event != nullptr) cudaEventDestroy(event);  // released once the wait no longer needs it
    current_.restore();
    cuda::check(rc, "cannot order one CUDA stream after another");
  }
  bool fuses() const override { return fuses_; }
  Token mark(void* stream) override {
    cudaEvent_t event = nullptr;
    current_.select(device_);  // an event is made on the current GPU, and must be the stream's
    cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    current_.restore();
    if (rc != cudaSuccess && event != nullptr) cudaEventDestroy(event);
    cuda::check(rc, "cannot mark the end of a GPU collective on its stream");
    return event;
  }
  // The group runs on the communicator's GPU, whichever thread's round enqueues it.
  void group_start() override {
    current_.select(device_);
    const ncclResult_t rc = nccl().GroupStart();
    if (rc != ncclSuccess && rc != ncclInProgress) current_.restore();
    check_nccl(rc, "ncclGroupStart");
    in_group_ = true;
  }
  void group_end() override {
    in_group_ = false;
    const ncclResult_t rc = nccl().GroupEnd();
    current_.restore();
    check_nccl(rc, "ncclGroupEnd");
  }

  // Queried and destroyed on the event's GPU, as it was made: the thread running the round may be a
  // waiter (ddl_wait) that never chose a GPU, and a CUDA call there would make a context on GPU 0.
  bool done(Token token) override {
    ncclResult_t async_error = ncclSuccess;
    check_nccl(nccl().CommGetAsyncError(comm_, &async_error), "ncclCommGetAsyncError");
    if (async_error != ncclSuccess && async_error != ncclInProgress)
      throw Error(fmt::format("NCCL reported an asynchronous error: {}", nccl().GetErrorString(async_error)));
    current_.select(device_);
    cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(token));
    current_.restore();
    if (rc == cudaErrorNotReady) return false;
    cuda::check(rc, "waiting for a GPU collective");
    return true;
  }
  void release(Token token) override {
    current_.select(device_);
    cudaEventDestroy(static_cast<cudaEvent_t>(token));
    current_.restore();
  }
  void abort() override {
    // An op that threw inside its group left the group open on this thread, which may be a caller's:
    // NCCL's group depth is per thread, and its next NCCL call (torch's too) would wait in it.
    if (in_group_) nccl().GroupEnd();
    in_group_ = false;
    if (comm_ != nullptr) nccl().CommAbort(comm_);
    comm_ = nullptr;
    current_.restore();  // and left the communicator's GPU selected
  }

 private:
  cudaError_t make_pool() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    cudaError_t rc = cudaMemPoolCreate(&pool_, &props);
    if (rc != cudaSuccess) return rc;
    uint64_t keep_all = UINT64_MAX;
    return cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all);
  }

  int device_ = 0;
  int size_ = 0;
  cudaMemPool_t pool_ = nullptr;  // fusion buffers
  bool fuses_ = false;
  cuda::CurrentDevice current_;  // only one thread at a time runs rounds
  bool in_group_ = false;        // between group_start() and group_end()
  ncclComm_t comm_ = nullptr;
};

// What one rank can do, as it tells the others: 'N' and its GPU's identity (NCCL loads and the
// buffer is on a GPU), 'H' and why its CUDA ops should go through host memory, or 'E' and why none
// can run, with a hint after a newline. A DDL_NCCL_LIBRARY that does not load is an error, not a
// reason to go through the host (the variable promises no quiet fallback); without a GPU the error
// is NCCL's when it does not load either (what a GPU node would then lack too), else the GPU's.
std::string gpu_verdict(const void* sample_pointer, const GpuRouteAsked& asked, int& device) {
  if (asked.via_host && !asked.check_gpu) return "H" + std::string(kViaHostAsked);
  std::optional<Error> no_nccl;
  if (!asked.via_host) {
    try {
      nccl();  // loads NCCL, or says what to set or load
    } catch (const Error& e) {
      no_nccl = e;
    }
  }
  if (no_nccl && nccl_library().named) return fmt::format("E{}\n{}", no_nccl->what(), no_nccl->hint());
  std::string identity;
  try {
    cuda::require_a_gpu();
    device = cuda::device_of(sample_pointer);
    identity = cuda::gpu_identity(device);
  } catch (const Error& e) {
    const Error& first = no_nccl ? *no_nccl : e;
    return fmt::format("E{}\n{}", first.what(), first.hint());
  }
  if (asked.via_host) return "H" + std::string(kViaHostAsked);
  if (no_nccl) return fmt::format("Hno NCCL loads ({})", no_nccl->what());
  return "N" + identity;
}

// Two ranks with one GPU identity, if any: NCCL refuses a communicator with two ranks on one GPU.
std::optional<std::pair<size_t, size_t>> ranks_sharing_a_gpu(const std::vector<std::string>& verdicts) {
  for (size_t a = 0; a < verdicts.size(); ++a)
    for (size_t b = a + 1; b < verdicts.size(); ++b)
      if (verdicts[a] == verdicts[b]) return std::pair{a, b};
  return std::nullopt;
}

}  // namespace

GpuRoute agree_on_gpu_route(Collectives& host, const void* sample_pointer, const GpuRouteAsked& asked) {
  int device = 0;
  const std::string mine = gpu_verdict(sample_pointer, asked, device);
  const std::vector<std::string> verdicts = host.allgather_bytes(mine);
  if (mine[0] == 'E') {
    const size_t newline = mine.find('\n');
    throw Error(mine.substr(1, newline - 1), mine.substr(newline + 1));
  }
  GpuRoute route;
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r][0] == 'E')
      throw Error(fmt::format("rank {} cannot run CUDA collectives: {}", r, verdicts[r].substr(1, verdicts[r].find('\n') - 1)));
    if (verdicts[r][0] == 'H' && route.via_host_because.empty())
      route.via_host_because = fmt::format("rank {}: {}", r, verdicts[r].substr(1));
  }
  if (!route.via_host_because.empty()) return route;
  if (auto shared = ranks_sharing_a_gpu(verdicts)) {
    route.via_host_because = fmt::format("ranks {} and {} share GPU {}, and NCCL needs a GPU of its own for each rank", shared->first,
                                         shared->second, verdicts[shared->first].substr(1));
    return route;
  }
  ncclUniqueId id{};
  std::string no_id;
  if (host.rank() == 0) {
    const ncclResult_t rc = nccl().GetUniqueId(&id);
    if (rc != ncclSuccess) no_id = nccl().GetErrorString(rc);
  }
  host.broadcast(&id, sizeof id, 0);
  std::vector<std::string> id_made = host.allgather_bytes(no_id);
  if (!id_made[0].empty()) throw Error(fmt::format("ncclGetUniqueId failed on rank 0: {}", id_made[0]));
  route.nccl = std::make_unique<NcclCollectives>(host, device, id);
  return route;
}

#else

GpuRoute agree_on_gpu_route(Collectives& host, const void*, const GpuRouteAsked& asked) {
  const bool via_host = asked.via_host && !asked.check_gpu;  // a build without CUDA has no GPU to check
  const std::vector<std::string> verdicts = host.allgather_bytes(via_host ? "H" : "E");
  if (!via_host) throw Error(nccl_library().error);
  for (size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r] != "H") throw Error(fmt::format("rank {} cannot run CUDA collectives: {}", r, nccl_library().error));
  return GpuRoute{nullptr, kViaHostAsked};
}

#endif

}  // namespace ddl::runtime
