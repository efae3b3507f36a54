// What one collective is, as every rank must agree on it, and a rank's offer to run one at once (a
// Proposal). Below both the engine and the transports (runtime/src/core).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
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
// The last kind: a new kind goes after it and becomes it. Peers' announcements of a later kind are
// refused as corrupt (announcement.cpp), and op_kind_name's table must name every kind up to it.
inline constexpr OpKind kLastOpKind = OpKind::AlltoallAny;
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
  uint32_t group_size = 0;         // a part of a grouped call of this many ops (0: not grouped)
  // The op's name is its place in an order every rank counts alike (an unnamed op's number, a torch
  // group's sequence): once such an op fails, later ones of the process set could pair with the
  // wrong calls, so they fail at once (see Negotiator).
  bool ordered = false;
  std::string failure;    // a local error of this rank: the op takes its place, and every rank fails it with this
  std::string call_site;  // where the caller submitted it ("train.py:42"), with DDL_CHECK_CALL_SITES=1; empty: not checked

  // Scale factors compare by their bits: a NaN factor every rank passes is the same op on every rank.
  bool operator==(const OpSpec& other) const {
    return std::tie(kind, dtype, reduce, root, count, counts, cuda, compress_fp16, shape, group_size, ordered, failure, call_site) ==
               std::tie(other.kind, other.dtype, other.reduce, other.root, other.count, other.counts, other.cuda, other.compress_fp16,
                        other.shape, other.group_size, other.ordered, other.failure, other.call_site) &&
           std::bit_cast<uint64_t>(prescale) == std::bit_cast<uint64_t>(other.prescale) &&
           std::bit_cast<uint64_t>(postscale) == std::bit_cast<uint64_t>(other.postscale);
  }
  // "allreduce float32[1000] sum", "broadcast int64[3] from rank 2", ...
  std::string describe() const;
};

// A rank's offer to run one op in the very round that announces it (the engine's fast path): when
// every rank proposes equal words in one round, every rank runs the op then, without waiting for
// the negotiation. The words name the op exactly: its kind, dtype, reduction, root and count, and
// either its response-cache id (a named op every rank has run before) or its place among the
// rank's unnamed ops together with a digest of the rest of its spec. All zero: no proposal.
struct Proposal {
  std::array<uint64_t, 4> words{};

  bool empty() const { return words[0] == 0; }
  bool operator==(const Proposal&) const = default;
  static Proposal for_cached(const OpSpec& spec, uint32_t cache_id);
  static Proposal for_unnamed(const OpSpec& spec, uint64_t unnamed_index);
};

}  // namespace ddl::runtime
