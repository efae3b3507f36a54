// What libddl asks of the CUDA runtime for the GPU collectives: which GPU holds a buffer, and
// making a GPU a thread's current one and back without making contexts (cuda_device.cpp also holds
// the CUDA runtime's DeviceMemory). Built with CUDA only (DDL_WITH_NCCL); the functions throw
// ddl::Error on a CUDA failure.
#pragma once

#if DDL_WITH_NCCL

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

namespace ddl::runtime::cuda {

void check(cudaError_t rc, const char* what);
// Throws when this process sees no GPU.
void require_a_gpu();
// The GPU that holds `pointer` (NULL: the current one; an empty buffer may come as NULL); throws if
// it is not GPU memory.
int device_of(const void* pointer);
// "host/PCI bus id" of a GPU: equal on two ranks only when they use one GPU.
std::string gpu_identity(int device);

// Makes a GPU the calling thread's current one until restore(). Selecting a GPU makes its context
// (hundreds of MiB on a GPU this rank may not use), so restore() goes back only to a GPU whose
// context exists, as torch's own device guards do; a thread that never chose one (the engine
// thread) stays on the selected GPU.
class CurrentDevice {
 public:
  void select(int device);
  void restore();

 private:
  int previous_ = -1, selected_ = -1;
};

}  // namespace ddl::runtime::cuda

#endif
