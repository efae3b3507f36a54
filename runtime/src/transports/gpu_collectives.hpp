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
  // After group_end(): a token that completes once everything enqueued on `stream` so far has.
  virtual Token mark(void* stream) = 0;
  // Whether the op of `token` finished; throws ddl::Error on an asynchronous NCCL error.
  virtual bool done(Token token) = 0;
  virtual void release(Token token) = 0;
  // Aborts the communicator after a failure or a timeout, so nothing stays blocked on the GPU.
  virtual void abort() = 0;
};

// NCCL on the device that holds `sample_pointer`; the unique id travels over `host` (rank 0 makes
// it, everyone receives it by broadcast). Throws ddl::Error when NCCL (nccl_library.hpp) or a GPU
// is not there.
std::unique_ptr<GpuCollectives> make_nccl_collectives(Collectives& host, const void* sample_pointer);

}  // namespace ddl::runtime
