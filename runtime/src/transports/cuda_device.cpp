#include "runtime/src/transports/cuda_device.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "runtime/src/transports/device_memory.hpp"

#if DDL_WITH_NCCL
#include <unistd.h>

#include <cuda.h>  // the driver API's types only: its one function here is looked up through the runtime
#endif

namespace ddl::runtime {

#if DDL_WITH_NCCL

namespace cuda {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(fmt::format("{}: {}", what, cudaGetErrorString(rc)), "is a GPU visible to this worker (CUDA_VISIBLE_DEVICES, nvidia-smi)?");
}

void require_a_gpu() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw Error("a CUDA collective was called but no GPU is visible to this worker",
                "check CUDA_VISIBLE_DEVICES and nvidia-smi; host buffers use the non-CUDA functions");
}

int device_of(const void* pointer) {
  if (pointer == nullptr) {
    int current = 0;
    check(cudaGetDevice(&current), "cannot read the current GPU");
    return current;
  }
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, pointer), "cannot inspect the GPU buffer");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    throw Error("a CUDA collective was given a buffer that is not CUDA device memory", "use the host functions for host buffers");
  return attributes.device;
}

std::string gpu_identity(int device) {
  char bus_id[64] = {};
  check(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device), "cannot read the GPU's PCI bus id");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}/{}", host, bus_id);
}

namespace {

// Whether `device`'s primary context exists. The driver's function is looked up through the
// runtime: libddl does not link libcuda. Unknown (no such entry point): true.
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

}  // namespace

void CurrentDevice::select(int device) {
  check(cudaGetDevice(&previous_), "cannot read the current GPU");
  if (previous_ != device) check(cudaSetDevice(device), "cannot select the communicator's GPU");
  selected_ = device;
}

void CurrentDevice::restore() {
  if (previous_ != selected_ && has_primary_context(previous_)) cudaSetDevice(previous_);  // none selected: both -1
  previous_ = selected_ = -1;
}

}  // namespace cuda

namespace {

// Each copy runs on the GPU that holds the device buffer (the copy's stream is that GPU's), and
// waits for its stream: the staging buffers are the engine's, reused by the next op.
class CudaMemory final : public DeviceMemory {
 public:
  void to_host(void* host, const void* device, size_t bytes, void* stream) override {
    copy(host, device, bytes, cudaMemcpyDeviceToHost, device, stream, "cannot copy a CUDA buffer to the host");
  }
  void to_device(void* device, const void* host, size_t bytes, void* stream) override {
    copy(device, host, bytes, cudaMemcpyHostToDevice, device, stream, "cannot copy a result back to its CUDA buffer");
  }

 private:
  void copy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, const void* device_buffer, void* stream, const char* what) {
    if (bytes == 0) return;
    current_.select(cuda::device_of(device_buffer));
    const auto s = static_cast<cudaStream_t>(stream);
    cudaError_t rc = cudaMemcpyAsync(to, from, bytes, kind, s);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
    current_.restore();
    cuda::check(rc, what);
  }
  cuda::CurrentDevice current_;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_cuda_memory() { return std::make_unique<CudaMemory>(); }

#else

std::unique_ptr<DeviceMemory> make_cuda_memory() {
  throw Error("libddl was built without CUDA, so it cannot copy CUDA buffers",
              "install a ddl built with the CUDA toolkit (cmake finds it by nvcc or CUDAToolkit_ROOT)");
}

#endif

}  // namespace ddl::runtime
