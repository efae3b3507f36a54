#include "runtime/src/backends/gpu_collectives.hpp"

#include <fmt/format.h>

#include "runtime/src/common/error.hpp"

#if DDL_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace ddl::runtime {

#if DDL_WITH_NCCL

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(rc)), "is a GPU visible to this worker (CUDA_VISIBLE_DEVICES, nvidia-smi)?");
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess && rc != ncclInProgress) throw Error(fmt::format("{}: {}", what, ncclGetErrorString(rc)));
}

ncclDataType_t nccl_type(ddl_dtype t) {
  switch (t) {
    case DDL_FLOAT16: return ncclFloat16;
    case DDL_BFLOAT16: return ncclBfloat16;
    case DDL_FLOAT32: return ncclFloat32;
    case DDL_FLOAT64: return ncclFloat64;
    case DDL_INT32: return ncclInt32;
    case DDL_INT64: return ncclInt64;
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
  NcclCollectives(Collectives& host, const void* sample_pointer) {
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, sample_pointer), "cannot inspect the GPU buffer");
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
      throw Error("a CUDA collective was given a buffer that is not CUDA device memory", "use the host functions for host buffers");
    device_ = attributes.device;
    check_cuda(cudaSetDevice(device_), "cannot select the buffer's GPU");
    ncclUniqueId id{};
    if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    check_nccl(ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
  }

  ~NcclCollectives() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  Token allreduce(const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op, void* stream) override {
    check_nccl(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, static_cast<cudaStream_t>(stream)), "ncclAllReduce");
    return mark(stream);
  }
  Token broadcast(void* data, size_t count, ddl_dtype dtype, int root, void* stream) override {
    check_nccl(ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, static_cast<cudaStream_t>(stream)), "ncclBroadcast");
    return mark(stream);
  }
  Token allgather(const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream) override {
    check_nccl(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, static_cast<cudaStream_t>(stream)), "ncclAllGather");
    return mark(stream);
  }
  void group_start() override { check_nccl(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() override { check_nccl(ncclGroupEnd(), "ncclGroupEnd"); }

  bool done(Token token) override {
    ncclResult_t async_error = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async_error), "ncclCommGetAsyncError");
    if (async_error != ncclSuccess && async_error != ncclInProgress)
      throw Error(fmt::format("NCCL reported an asynchronous error: {}", ncclGetErrorString(async_error)));
    cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(token));
    if (rc == cudaErrorNotReady) return false;
    check_cuda(rc, "waiting for a GPU collective");
    return true;
  }
  void release(Token token) override { cudaEventDestroy(static_cast<cudaEvent_t>(token)); }
  void abort() override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  Token mark(void* stream) {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return event;
  }

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<GpuCollectives> make_nccl_collectives(Collectives& host, const void* sample_pointer) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw Error("a CUDA collective was called but no GPU is visible to this worker",
                "check CUDA_VISIBLE_DEVICES and nvidia-smi; host buffers use the non-CUDA functions");
  return std::make_unique<NcclCollectives>(host, sample_pointer);
}

std::string nccl_version_compiled_in() { return fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH); }

#else

std::unique_ptr<GpuCollectives> make_nccl_collectives(Collectives&, const void*) {
  throw Error("this libddl was built without NCCL, so it cannot run collectives on CUDA buffers",
              "rebuild where CUDA and NCCL are installed (DDL_WITH_NCCL)");
}

std::string nccl_version_compiled_in() { return ""; }

#endif

}  // namespace ddl::runtime
