#include "runtime/src/transports/gpu_collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "common/error.hpp"
#include "runtime/src/engine/dtype.hpp"
#include "runtime/src/transports/nccl_library.hpp"

#if DDL_WITH_NCCL
#include <cuda.h>  // the driver API's types only: its one function here is looked up through the runtime
#include <cuda_runtime.h>
#endif

namespace ddl::runtime {

#if DDL_WITH_NCCL

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(fmt::format("{}: {}", what, cudaGetErrorString(rc)), "is a GPU visible to this worker (CUDA_VISIBLE_DEVICES, nvidia-smi)?");
}

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
  }
  return ncclFloat32;
}

void require_a_gpu() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw Error("a CUDA collective was called but no GPU is visible to this worker",
                "check CUDA_VISIBLE_DEVICES and nvidia-smi; host buffers use the non-CUDA functions");
}

// The GPU that holds `pointer` (NULL: the current one; an empty buffer may come as NULL); throws if
// it is not GPU memory.
int device_of(const void* pointer) {
  if (pointer == nullptr) {
    int current = 0;
    check_cuda(cudaGetDevice(&current), "cannot read the current GPU");
    return current;
  }
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, pointer), "cannot inspect the GPU buffer");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    throw Error("a CUDA collective was given a buffer that is not CUDA device memory", "use the host functions for host buffers");
  return attributes.device;
}

// Whether `device`'s primary context exists. Selecting a device creates its context (hundreds of MiB
// on a GPU this rank may not use), so a thread is only switched back to a device already in use, as
// torch's own device guards do. The driver's function is looked up through the runtime: libddl does
// not link libcuda. Unknown (no such entry point): true.
bool has_primary_context(int device) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  using GetDevice = CUresult (*)(CUdevice*, int);
  static const auto [get_state, get_device] = [] {
    void* state = nullptr;
    void* device_of_ordinal = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuDeviceGet", &device_of_ordinal, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
#else
    if (cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &state, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPoint("cuDeviceGet", &device_of_ordinal, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
#endif
      return std::pair<GetState, GetDevice>{nullptr, nullptr};
    return std::pair{reinterpret_cast<GetState>(state), reinterpret_cast<GetDevice>(device_of_ordinal)};
  }();
  if (get_state == nullptr) return true;
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  return get_device(&handle, device) == CUDA_SUCCESS && get_state(handle, &flags, &active) == CUDA_SUCCESS && active != 0;
}

// Makes `device` the calling thread's GPU until restore(). Rounds run on the engine thread or on
// the thread of a caller of a blocking op, whose own current GPU stays as it was where that GPU is in
// use; a thread that never chose one (the engine thread) simply stays on the communicator's.
class CurrentDevice {
 public:
  void select(int device) {
    check_cuda(cudaGetDevice(&previous_), "cannot read the current GPU");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cannot select the communicator's GPU");
    selected_ = device;
  }
  void restore() {
    if (previous_ != selected_ && has_primary_context(previous_)) cudaSetDevice(previous_);  // none selected: both -1
    previous_ = selected_ = -1;
  }

 private:
  int previous_ = -1, selected_ = -1;
};

// "host/PCI bus id" of a GPU: equal on two ranks only when they would share one GPU.
std::string gpu_identity(int device) {
  char bus_id[64] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device), "cannot read the GPU's PCI bus id");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}/{}", host, bus_id);
}

// NCCL refuses a communicator with two ranks on one GPU ("invalid usage"); say which ranks and why.
void refuse_shared_gpus(const std::vector<std::string>& gpus) {
  for (size_t a = 0; a < gpus.size(); ++a)
    for (size_t b = a + 1; b < gpus.size(); ++b)
      if (gpus[a] == gpus[b])
        throw Error(fmt::format("ranks {} and {} both use GPU {}, and NCCL needs a GPU of its own for each rank", a, b, gpus[a]),
                    "start one worker per GPU (ddl run without --share-gpus, or fewer workers), or keep CUDA tensors off the collectives");
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
  // Every rank takes part in the same host collectives whatever fails locally (another rank's
  // buffer, its GPU), then all ranks agree whether any failed: a rank that threw early would leave
  // the host transport out of step with its peers.
  NcclCollectives(Collectives& host, const void* sample_pointer) {
    ncclUniqueId id{};
    std::string local_error, local_hint;
    try {
      nccl();  // loads NCCL, or says what to set or load: before the GPU, which a machine without NCCL may lack too
      require_a_gpu();
      device_ = device_of(sample_pointer);
      if (host.rank() == 0) check_nccl(nccl().GetUniqueId(&id), "ncclGetUniqueId");
    } catch (const Error& e) {
      local_error = e.what();
      local_hint = e.hint();
    }
    host.broadcast(&id, sizeof id, 0);
    const std::vector<std::string> gpus = host.allgather_bytes(local_error.empty() ? gpu_identity(device_) : std::string());
    if (!local_error.empty()) throw Error(local_error, local_hint);
    if (std::find(gpus.begin(), gpus.end(), std::string()) != gpus.end())
      throw Error("another rank could not set up NCCL for this op; its own error says why");
    refuse_shared_gpus(gpus);
    current_.select(device_);  // ncclCommInitRank binds the communicator to the current GPU
    const ncclResult_t rc = nccl().CommInitRank(&comm_, host.size(), id, host.rank());
    current_.restore();
    // Every rank has a communicator or none has: a rank whose init failed alone would leave the
    // others running the next CUDA ops' host steps (alltoallv's count check) without it.
    const bool made = rc == ncclSuccess || rc == ncclInProgress;
    const std::vector<std::string> made_by = host.allgather_bytes(made ? "1" : "0");
    if (std::find(made_by.begin(), made_by.end(), "0") != made_by.end()) {
      if (made) nccl().CommAbort(comm_);
      comm_ = nullptr;
      if (!made) check_nccl(rc, "ncclCommInitRank");
      throw Error("another rank could not create its NCCL communicator; its own error says why");
    }
    size_ = host.size();
  }

  ~NcclCollectives() override {
    if (comm_ != nullptr) nccl().CommDestroy(comm_);
  }

  void allreduce(const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op, void* stream) override {
    // NCCL 2.28.9 on one rank left the last elements of an out-of-place ncclAvg unwritten (H100:
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
  Token mark(void* stream) override {
    cudaEvent_t event = nullptr;
    current_.select(device_);  // an event is made on the current GPU, and must be the stream's
    cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    current_.restore();
    if (rc != cudaSuccess && event != nullptr) cudaEventDestroy(event);
    check_cuda(rc, "cannot mark the end of a GPU collective on its stream");
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
    check_cuda(rc, "waiting for a GPU collective");
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
  int device_ = 0;
  int size_ = 0;
  CurrentDevice current_;  // only one thread at a time runs rounds
  bool in_group_ = false;  // between group_start() and group_end()
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<GpuCollectives> make_nccl_collectives(Collectives& host, const void* sample_pointer) {
  return std::make_unique<NcclCollectives>(host, sample_pointer);
}

#else

std::unique_ptr<GpuCollectives> make_nccl_collectives(Collectives&, const void*) { throw Error(nccl_library().error); }

#endif

}  // namespace ddl::runtime
