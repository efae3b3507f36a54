// Copies between GPU memory and host memory, for CUDA ops that run through the host transports
// (ranks that share a GPU, no NCCL: Engine's staging). Only the thread running the engine's round
// calls them.
#pragma once

#include <cstddef>
#include <memory>

namespace ddl::runtime {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Copies `bytes` of GPU memory at `device` to `host` once the work enqueued on `stream` before
  // has run; returns when they are there.
  virtual void to_host(void* host, const void* device, size_t bytes, void* stream) = 0;
  // Copies `bytes` of `host` to GPU memory at `device`, enqueued on `stream`; returns when they
  // are there (work enqueued on `stream` later sees them; `host` may be reused).
  virtual void to_device(void* device, const void* host, size_t bytes, void* stream) = 0;
};

// The CUDA runtime's copies; throws ddl::Error when libddl was built without CUDA.
std::unique_ptr<DeviceMemory> make_cuda_memory();

}  // namespace ddl::runtime
