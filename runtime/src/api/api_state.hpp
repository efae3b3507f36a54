// What the C API's files share: the process-wide runtime, its process sets, the calling thread's
// last error, and where an op of a process set runs. Internal to libddl.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gloo/rendezvous/store.h>

#include "ddl/ddl.h"
#include "rendezvous/pmix_store.hpp"
#include "runtime/src/engine/engine.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::api {

using runtime::Engine;
using runtime::OpKind;
using runtime::OpSpec;

// A process set. The ddl_process_set handed out is its id (1, 2, ...), not this object's address,
// so a handle used after its set was destroyed, or after ddl_finalize, is an error and not a crash.
struct ProcessSet {
  std::vector<int> ranks;          // world ranks, ascending
  int rank = -1;                   // this rank within the set; -1 if not a member
  std::shared_ptr<Engine> engine;  // members only
  bool members_only = false;       // made by ddl_process_set_create_among: released locally
};

// Where this rank sits among the world's nodes.
struct Placement {
  int local_rank = 0, local_size = 1, node_rank = 0, num_nodes = 1;
  bool consistent() const {
    return local_size >= 1 && local_rank >= 0 && local_rank < local_size && num_nodes >= 1 && node_rank >= 0 && node_rank < num_nodes;
  }
};

// The world this process joined in ddl_init, until ddl_finalize.
struct Runtime {
  Placement placement;
  std::string mode;                      // store (ddl run's), pmix, program store (ddl_init_with_store) or single
  std::string interface;                 // the address this host's peers reach it at (Gloo)
  bool hosts_numbered_in_order = false;  // each host's ranks follow each other (0-3 on one, 4-7 on the next)
  int generation = 0;
  std::unique_ptr<runtime::PmixSession> pmix;      // while bootstrapped through PMIx
  std::unique_ptr<gloo::rendezvous::Store> store;  // the world's rendezvous store, for process sets
  bool shared_memory = false;                      // the world's ranks talk through shared memory
  std::shared_ptr<Engine> engine;                  // destroyed before pmix
  std::mutex sets_mutex;
  std::map<uintptr_t, std::shared_ptr<ProcessSet>> sets;
  // Engines of members-only sets this rank released: they take part in rounds until every member
  // has, so that releasing one never waits for the others; ddl_finalize waits for them.
  std::vector<std::shared_ptr<Engine>> retiring;
  uintptr_t next_set_id = 1;  // every rank creates sets in the same order, so ids agree
  // Sets made by their members only (ddl_process_set_create_among) take handles of their own
  // range: the world's sets must keep numbering alike on every rank.
  uintptr_t next_member_set_id = uintptr_t{1} << 40;
  ~Runtime() {
    sets.clear();  // their engines go before the store and PMIx they rendezvoused through
    retiring.clear();
    engine.reset();
    store.reset();
  }
};

// Records `message` as the calling thread's last error (ddl_last_error) and returns `status`.
ddl_status fail(ddl_status status, std::string message);
// The calling thread's last error.
const std::string& last_error();

// The initialized runtime, or nullptr.
std::shared_ptr<Runtime> current_runtime();

// The engine settings from DDL_CYCLE_TIME_MS, DDL_FUSION_THRESHOLD, DDL_TIMEOUT and DDL_TIMELINE.
runtime::EngineConfig engine_config(int rank);
// The address this host's peers reach it at, for a world spread over `num_nodes` nodes, found on the
// route to `towards` where that is given.
std::string interface_host(int num_nodes, const std::string& towards);

// Runs `body`; no C++ exception may cross into the caller's C.
template <typename Body>
ddl_status guarded(const char* what, Body body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(DDL_ERROR_INTERNAL, fmt::format("{}: out of memory", what));
  } catch (const std::exception& e) {
    return fail(DDL_ERROR_INTERNAL, fmt::format("{}: {}", what, e.what()));
  }
}

// Runs `body` on the initialized runtime.
template <typename Body>
ddl_status with_runtime(Body body) {
  return guarded("libddl", [&] {
    auto rt = current_runtime();
    if (!rt) return fail(DDL_ERROR_NOT_INITIALIZED, "ddl_init() has not been called (or ddl_finalize() has)");
    return body(*rt);
  });
}

// Where an op on a process set runs: the world's engine for NULL, else the set's own.
struct Target {
  Engine* engine = nullptr;
  std::shared_ptr<Engine> keep;  // a set's engine stays alive while the op is submitted
  int rank = 0, size = 1;
  bool handed_over = false;  // the op reached the engine (operations.cpp's submit): it has taken its place
};
ddl_status resolve(Runtime& rt, ddl_process_set handle, Target& t);

// Refuses an op with `status` and `message` (the error set), its place taken as the *_ex functions'
// refusals take it (operations.cpp): for checks made before an _ex function is called.
ddl_status refuse_in_place(const char* name, const ddl_op_options* options, ddl_status status, const std::string& message);

// Runs an op on the calling thread until it is done (Engine::run); the status, with the error set.
ddl_status run_to_completion(Engine& engine, const char* name, OpSpec spec, const void* send, void* recv, void* stream = nullptr);

}  // namespace ddl::api
