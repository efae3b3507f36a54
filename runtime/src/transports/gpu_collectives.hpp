// Collectives on CUDA device memory (NCCL), enqueued on the caller's stream and completed
// asynchronously. Only the thread running the engine's round calls them (the engine thread, or the
// caller of a blocking op running rounds itself), one at a time, in the same order on every rank.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {

class GpuCollectives {
 public:
  using Token = void*;  // marks the end of what was enqueued on a stream
  virtual ~GpuCollectives() = default;
  // Starts and ends a group of ops that NCCL launches together. Inside a group NCCL may put
  // nothing on the streams yet: only after group_end() are the ops there to be marked.
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void allreduce(const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op, void* stream) = 0;
  virtual void broadcast(void* data, size_t count, ddl_dtype dtype, int root, void* stream) = 0;
  virtual void allgather(const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream) = 0;
  // Each rank's block of `recv_count` elements of the reduced `send` (size() blocks, rank order).
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, ddl_dtype dtype, ddl_reduce_op op, void* stream) = 0;
  // Block r of `send` (send_counts[r] elements) goes to rank r; rank r's block lands in `recv` at
  // the sum of recv_counts before r. Counts in elements, one per rank.
  virtual void alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv, const std::vector<size_t>& recv_counts,
                         ddl_dtype dtype, void* stream) = 0;
  // A fusion buffer: `bytes` of GPU memory for work enqueued on `stream`, given back with
  // release_buffer() on the same stream once that work is enqueued (stream-ordered: the memory is
  // reused only after the work before the release has run).
  virtual void* buffer(size_t bytes, void* stream) = 0;
  virtual void release_buffer(void* buffer, void* stream) = 0;
  // Enqueues a copy of `bytes` of GPU memory on `stream`. Outside a group: inside one, NCCL's ops
  // are not on the stream yet, and the copy would run before them.
  virtual void copy(void* to, const void* from, size_t bytes, void* stream) = 0;
  // Work enqueued on `later` from now on waits for what is enqueued on `earlier` so far.
  virtual void order_after(void* later, void* earlier) = 0;
  // Whether CUDA allreduces fuse (buffer() works): alike on every rank, agreed when it was made.
  virtual bool fuses() const = 0;
  // After group_end(): a token that completes once everything enqueued on `stream` so far has.
  virtual Token mark(void* stream) = 0;
  // Whether the op of `token` finished; throws ddl::Error on an asynchronous NCCL error.
  virtual bool done(Token token) = 0;
  virtual void release(Token token) = 0;
  // Aborts the communicator after a failure or a timeout, so nothing stays blocked on the GPU.
  virtual void abort() = 0;
};

// How a world's CUDA ops run, agreed by every rank (over `host`) on the first one.
struct GpuRoute {
  std::unique_ptr<GpuCollectives> nccl;  // NCCL on the GPU of `sample_pointer`: every rank has a GPU of its own
  std::string via_host_because;          // otherwise: why they go through host memory (DeviceMemory)
};
struct GpuRouteAsked {
  bool via_host = false;  // DDL_CUDA_VIA_HOST
  bool check_gpu = true;  // false: the buffers are not the CUDA runtime's (the engine's tests stage host memory)
};
// NCCL where every rank has a GPU of its own and NCCL loads on every rank; through host memory
// where a rank asked for it (DDL_CUDA_VIA_HOST), NCCL does not load on some rank, or ranks share a
// GPU. Throws ddl::Error, on every rank, when some rank cannot run CUDA ops at all (no GPU, a
// buffer that is not GPU memory, a build without CUDA).
GpuRoute agree_on_gpu_route(Collectives& host, const void* sample_pointer, const GpuRouteAsked& asked);

}  // namespace ddl::runtime
