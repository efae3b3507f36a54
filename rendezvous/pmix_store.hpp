// Joining the world through PMIx, when the process was started by a PMIx launcher (OpenMPI's
// mpirun, `srun --mpi=pmix`) and libddl was built with PMIx (DDL_WITH_PMIX).
#pragma once

#include <chrono>
#include <memory>

namespace gloo::rendezvous {
class Store;
}

namespace ddl::runtime {

struct PmixWorld {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, node_rank = 0;
};

// PMIx for the life of the object: PMIx_Init in the constructor, PMIx_Finalize in the destructor.
class PmixSession {
 public:
  explicit PmixSession(std::chrono::milliseconds timeout);  // throws ddl::Error when PMIx_Init fails
  ~PmixSession();
  PmixSession(const PmixSession&) = delete;
  PmixSession& operator=(const PmixSession&) = delete;

  const PmixWorld& world() const { return world_; }
  // Gloo's rendezvous store over PMIx Put/Fence/Get. Each rank's set()s become visible to the
  // others at the next wait() after them, which runs a fence that every rank must join.
  // Keys are put under `prefix`, so successive ddl_init calls in one process never see each other's.
  // fence_on_wait=false: wait() does nothing and get() relies on PMIx fetching the key from its
  // owner, for rendezvous among a subset of the ranks (a process set), where no world fence runs.
  std::unique_ptr<gloo::rendezvous::Store> gloo_store(const std::string& prefix, bool fence_on_wait = true);

  struct State;  // shared with the store it hands out

 private:
  std::shared_ptr<State> state_;
  PmixWorld world_;
};

// Whether this libddl was built with PMIx.
bool pmix_compiled_in();

}  // namespace ddl::runtime
