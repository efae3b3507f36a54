// What one named collective is, as every rank must agree on it, and how ranks announce theirs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddl/ddl.h"

namespace ddl::runtime {

enum class OpKind : uint8_t {
  Allreduce = 0,
  Broadcast = 1,
  Allgather = 2,
  Allgatherv = 3,
  Alltoall = 4,
  Barrier = 5,
  Reducescatter = 6,
  Alltoallv = 7,
  AllgatherAny = 8,  // an allgatherv whose per-rank counts are exchanged when it runs
  Join = 9,          // done once every rank has joined; joined ranks stand in for the others' ops
  AlltoallAny = 10   // an alltoallv whose receive counts are exchanged when it runs
};
const char* op_kind_name(OpKind kind);

struct OpSpec {
  OpKind kind = OpKind::Allreduce;
  ddl_dtype dtype = DDL_FLOAT32;
  ddl_reduce_op reduce = DDL_SUM;  // allreduce only
  int32_t root = 0;                // broadcast only
  uint64_t count = 0;              // elements sent by each rank (per destination for alltoall; in all for reducescatter)
  std::vector<uint64_t> counts;    // allgatherv: elements from each rank; reducescatter: elements to each rank
  bool cuda = false;               // the buffers are CUDA device memory (NCCL)
  bool compress_fp16 = false;      // allreduce float32 travels as float16
  std::vector<int64_t> shape;      // the caller's tensor shape, when it gave one (ranks must agree)
  double prescale = 1.0;           // allreduce, reducescatter: input *= prescale
  double postscale = 1.0;          // allreduce, reducescatter: result *= postscale

  bool operator==(const OpSpec&) const = default;
  // "allreduce float32[1000] sum", "broadcast int64[3] from rank 2", ...
  std::string describe() const;
};

// What one rank tells the others in one negotiation round.
struct Announcement {
  std::vector<std::pair<std::string, OpSpec>> submitted;  // ops newly submitted since the last round
  std::vector<uint32_t> cached;                           // more of them, as response-cache ids
  bool finalizing = false;                                // this rank called ddl_finalize
  bool joined = false;                                    // this rank waits in ddl_join
  std::vector<std::string> expired;                       // rank 0 only: ops that waited too long

  std::string serialize() const;
  static Announcement parse(const std::string& bytes);  // throws std::runtime_error when malformed
};

}  // namespace ddl::runtime
