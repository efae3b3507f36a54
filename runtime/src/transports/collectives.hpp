// The transport under the engine: blocking collectives on host memory among the world's ranks.
// Only the thread running the engine's rounds calls them, one at a time, in the same order on every rank.
// Every size here is in bytes; a reduction also names its element's size, which the bytes are a
// multiple of.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/src/core/dtype.hpp"
#include "runtime/src/core/op_spec.hpp"

namespace gloo::rendezvous {
class Store;
}

namespace ddl::runtime {

// One tensor of a fused allreduce: `bytes` of this rank's input at `send`, the result into `recv`
// (which may be `send`).
struct ReducePiece {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
};

// An op this rank proposes to run in the round that announces it (see Engine::run).
struct ProposedOp {
  Proposal proposal;
  OpKind kind = OpKind::Barrier;    // Allreduce, Broadcast or Barrier
  const void* send = nullptr;       // allreduce: this rank's input
  void* recv = nullptr;             // allreduce: the result; broadcast: the buffer (the source on the root)
  size_t bytes = 0;                 // allreduce, broadcast
  size_t element_size = 0;          // allreduce: `bytes` is a multiple of it
  ReduceFunction reduce = nullptr;  // allreduce
  int root = 0;                     // broadcast
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // One byte string from every rank, in rank order (the negotiation round).
  virtual std::vector<std::string> allgather_bytes(const std::string& mine) = 0;
  // The negotiation round of a rank that proposes `op`. `mine` makes this rank's announcement (of
  // the op, with the proposal); a transport calls it only when it needs the bytes, so that a round
  // in which every rank proposed the same op costs no serializing. Returns:
  //   Ran       the transport ran `op` in this step, which it may do only when every rank proposed
  //             exactly op.proposal in this round (every rank sees the same proposals, so all
  //             decide alike); `round` is left empty;
  //   Agreed    every rank proposed exactly op.proposal but the transport did not run it: the
  //             engine runs it now with the calls below, alike on every rank; `round` is empty;
  //   Announced every rank's announcement is in `round`, and `op.recv` is untouched: the engine
  //             finds the proposals there (all alike: it runs the op as for Agreed).
  // Ranks that propose nothing call allgather_bytes: the two are one step of the same sequence.
  enum class ProposalOutcome { Ran, Agreed, Announced };
  virtual ProposalOutcome allgather_bytes_proposing(const std::function<std::string()>& mine, const ProposedOp& op,
                                                    std::vector<std::string>& round) {
    (void)op;
    round = allgather_bytes(mine());
    return ProposalOutcome::Announced;
  }
  // In place: each element of `data` (`bytes` of elements of `element_size` bytes) = reduce over ranks.
  virtual void allreduce(void* data, size_t bytes, size_t element_size, ReduceFunction reduce) = 0;
  // Whether allreduce_pieces works here; every rank gets the same answer.
  virtual bool reduces_pieces() const { return false; }
  // One allreduce of the pieces' inputs back to back (as if packed into one buffer; each piece a
  // multiple of `element_size` bytes), reduced
  // straight from and into the pieces' buffers, which must not overlap one another: a fused
  // allreduce without a fusion buffer. Only where reduces_pieces() (the engine packs a fusion
  // buffer and calls allreduce elsewhere).
  virtual void allreduce_pieces(std::span<const ReducePiece> pieces, size_t element_size, ReduceFunction reduce) {
    (void)pieces, (void)element_size, (void)reduce;
    throw std::logic_error("this transport cannot reduce pieces");
  }
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // recv holds bytes_per_rank[r] bytes from each rank r, in rank order.
  virtual void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) = 0;
  virtual void alltoall(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual void barrier() = 0;
};

// The world of one process: every collective is a copy.
std::unique_ptr<Collectives> make_single_process_collectives();

// Gloo over TCP, wired up through `store` (the ddl store or PMIx). `interface_host` is the address
// peers reach this rank at.
std::unique_ptr<Collectives> make_gloo_collectives(int rank, int size, gloo::rendezvous::Store& store, const std::string& interface_host,
                                                   std::chrono::milliseconds timeout);

// Collectives through one shared-memory segment, for a world whose ranks all run on this node;
// nullptr (on every rank alike) when the world is too large or some rank cannot map the segment.
std::unique_ptr<Collectives> make_shared_memory_collectives(int rank, int size, gloo::rendezvous::Store& store,
                                                            std::chrono::milliseconds timeout);

// Gloo among all ranks, plus, when the world spans hosts (ranks numbered host by host, each rank
// giving its host's `node_rank`; hosts may hold different numbers), some host holds more than one
// rank, and every host can map shared memory: shared memory within a host and Gloo between hosts
// for the bulk collectives. Otherwise plain Gloo. Every rank of the world calls it.
std::unique_ptr<Collectives> make_hierarchical_collectives(int rank, int size, int node_rank, gloo::rendezvous::Store& store,
                                                           const std::string& interface_host, std::chrono::milliseconds timeout);

}  // namespace ddl::runtime
