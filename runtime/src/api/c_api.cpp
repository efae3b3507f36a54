// The C API of libddl (ddl/ddl.h): argument checks, the process-wide runtime, thread-local errors.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gloo/rendezvous/store.h>

#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/net_address.hpp"
#include "ddl/ddl.h"
#include "rendezvous/gloo_store.hpp"
#include "rendezvous/pmix_store.hpp"
#include "rendezvous/tcp_store_client.hpp"
#include "runtime/src/engine/dtype.hpp"
#include "runtime/src/engine/engine.hpp"
#include "runtime/src/transports/collectives.hpp"
#include "runtime/src/transports/gpu_collectives.hpp"
#include "runtime/src/transports/nccl_library.hpp"

struct ddl_handle_s {
  std::shared_ptr<ddl::runtime::OpState> state;
  std::weak_ptr<ddl::runtime::Engine> engine;  // the op's, which a wait runs rounds on; gone after finalize
};

// A process set. The ddl_process_set handed out is its id (1, 2, ...), not this object's address,
// so a handle used after its set was destroyed, or after ddl_finalize, is an error and not a crash.
struct ProcessSet {
  std::vector<int> ranks;                        // world ranks, ascending
  int rank = -1;                                 // this rank within the set; -1 if not a member
  std::shared_ptr<ddl::runtime::Engine> engine;  // members only
  bool members_only = false;                     // made by ddl_process_set_create_among: released locally
};

namespace {

using ddl::runtime::Engine;
using ddl::runtime::OpKind;
using ddl::runtime::OpSpec;

struct Placement {
  int local_rank = 0, local_size = 1, node_rank = 0, num_nodes = 1;
  bool consistent() const {
    return local_size >= 1 && local_rank >= 0 && local_rank < local_size && num_nodes >= 1 && node_rank >= 0 && node_rank < num_nodes;
  }
};

struct Runtime {
  Placement placement;
  std::string mode;  // store, pmix or single
  int generation = 0;
  std::unique_ptr<ddl::runtime::PmixSession> pmix;  // while bootstrapped through PMIx
  std::unique_ptr<gloo::rendezvous::Store> store;   // the world's rendezvous store, for process sets
  bool shared_memory = false;                       // the world's ranks talk through shared memory
  std::shared_ptr<Engine> engine;                   // destroyed before pmix
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

std::mutex g_mutex;
// Never destroyed: a process that exits without ddl_finalize (say, after an error) must not wait
// at exit for the other ranks to finalize; its connections close and the peers see it leave.
std::shared_ptr<Runtime>& g_runtime = *new std::shared_ptr<Runtime>;
int g_generation = 0;  // keeps the store keys of successive ddl_init calls apart
thread_local std::string t_last_error;

ddl_status fail(ddl_status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

std::shared_ptr<Runtime> runtime() {
  std::lock_guard lock(g_mutex);
  return g_runtime;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0') throw ddl::Error(fmt::format("{}='{}' is not a whole number", name, v));
  // Cast to int, 4294967296 became rank 0: a second rank 0, silently.
  if (errno == ERANGE || n < INT_MIN || n > INT_MAX) throw ddl::Error(fmt::format("{}='{}' is out of range", name, v));
  return static_cast<int>(n);
}

// The file this rank writes a timeline to: "%r" in the path becomes the rank, so every rank can
// write its own; otherwise rank 0 writes and the others none (empty), as Horovod's coordinator does.
std::string timeline_path_for(std::string path, int rank) {
  auto at = path.find("%r");
  if (at != std::string::npos) return path.replace(at, 2, std::to_string(rank));
  return rank == 0 ? path : std::string();
}

ddl::runtime::EngineConfig engine_config(int rank) {
  ddl::runtime::EngineConfig c;
  c.cycle_time = std::chrono::microseconds(static_cast<long long>(ddl::number_from_environment("DDL_CYCLE_TIME_MS", 1, 0, 60'000) * 1000));
  c.fusion_threshold = static_cast<size_t>(ddl::number_from_environment("DDL_FUSION_THRESHOLD", 64.0 * 1024 * 1024, 0, 0x1p40));
  c.timeout = ddl::timeout_from_environment();
  if (const char* t = std::getenv("DDL_TIMELINE"); t != nullptr && *t != '\0') c.timeline_path = timeline_path_for(t, rank);
  return c;
}

// store: `ddl run`'s store; pmix: a PMIx launcher; single: this process alone.
std::string bootstrap_mode() {
  const char* forced = std::getenv("DDL_BOOTSTRAP");
  if (forced != nullptr && *forced != '\0') {
    std::string mode = forced;
    if (mode != "store" && mode != "pmix" && mode != "single")
      throw ddl::Error(fmt::format("DDL_BOOTSTRAP='{}' is not one of store, pmix, single", mode));
    return mode;
  }
  if (std::getenv("DDL_STORE_ADDR") != nullptr) return "store";
  if (std::getenv("PMIX_RANK") != nullptr && ddl::runtime::pmix_compiled_in()) return "pmix";
  return "single";
}

// One node: peers are reached over loopback. Several: at this host's address on the route to the
// store's host (DDL_GLOO_ADDR overrides it), else (PMIx, or the store's own host) by its name.
std::string interface_host(int num_nodes) {
  if (num_nodes <= 1) return "127.0.0.1";
  if (const char* given = std::getenv("DDL_GLOO_ADDR"); given != nullptr && *given != '\0') return given;
  if (const char* store = std::getenv("DDL_STORE_ADDR"); store != nullptr) {
    const std::string addr = store;
    std::string towards = ddl::address_towards(addr.substr(0, addr.rfind(':')));
    if (!towards.starts_with("127.")) return towards;  // on the store's own host the route is loopback
  }
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// A timeline is valid JSON only once closed, and most programs (Python scripts above all) exit
// without ddl_finalize: close the world's at exit. try_lock: a thread that holds g_mutex at exit
// may never let go of it.
void close_timeline_at_exit() {
  std::unique_lock lock(g_mutex, std::try_to_lock);
  if (!lock.owns_lock() || !g_runtime || !g_runtime->engine) return;
  g_runtime->engine->timeline().close();
}

std::shared_ptr<Runtime> start_runtime(int generation) {
  static std::once_flag at_exit_registered;
  std::call_once(at_exit_registered, [] { std::atexit(close_timeline_at_exit); });
  auto rt = std::make_shared<Runtime>();
  rt->mode = bootstrap_mode();
  rt->generation = generation;
  if (rt->mode == "single") {
    rt->engine = std::make_shared<Engine>(ddl::runtime::make_single_process_collectives(), engine_config(0));
    return rt;
  }
  int rank = 0, size = 1;
  if (rt->mode == "store") {
    rank = env_int("DDL_RANK", -1);
    size = env_int("DDL_SIZE", -1);
    if (rank < 0 || size < 1 || rank >= size)
      throw ddl::Error("DDL_RANK and DDL_SIZE are missing or out of range: start the program with `ddl run`");
    rt->placement = {env_int("DDL_LOCAL_RANK", 0), env_int("DDL_LOCAL_SIZE", 1), env_int("DDL_NODE_RANK", 0), env_int("DDL_NUM_NODES", 1)};
    if (!rt->placement.consistent())
      throw ddl::Error(
          "DDL_LOCAL_RANK, DDL_LOCAL_SIZE, DDL_NODE_RANK and DDL_NUM_NODES are out of range: start the program with `ddl run`");
    rt->store = ddl::runtime::make_tcp_gloo_store(ddl::store::TcpStoreClient::from_environment(), fmt::format("ddl/{}/gloo", generation));
  } else {
    rt->pmix = std::make_unique<ddl::runtime::PmixSession>(engine_config(0).timeout);
    const auto& w = rt->pmix->world();
    rank = w.rank;
    size = w.size;
    // PMIx node ids need not count from 0; a world whose ranks all share this node is one node.
    rt->placement = {w.local_rank, w.local_size, w.local_size == w.size ? 0 : w.node_rank, w.local_size == w.size ? 1 : 2};
    rt->store = rt->pmix->gloo_store(std::to_string(generation));
  }
  auto config = engine_config(rank);
  // All ranks on this node: shared memory, unless DDL_SHM=0; else (or if it cannot be set up) Gloo.
  std::unique_ptr<ddl::runtime::Collectives> collectives;
  const char* shm = std::getenv("DDL_SHM");
  if (rt->placement.local_size == size && !(shm != nullptr && std::string(shm) == "0"))
    collectives = ddl::runtime::make_shared_memory_collectives(rank, size, *rt->store, config.timeout);
  rt->shared_memory = collectives != nullptr;
  // Several hosts (ddl run's store: ranks host by host, any number on each): shared memory within
  // a host and Gloo between hosts, unless DDL_SHM=0.
  const bool several_hosts = rt->mode == "store" && rt->placement.num_nodes > 1;
  if (!collectives && several_hosts && !(shm != nullptr && std::string(shm) == "0"))
    collectives = ddl::runtime::make_hierarchical_collectives(rank, size, rt->placement.node_rank, *rt->store,
                                                              interface_host(rt->placement.num_nodes), config.timeout);
  if (!collectives)
    collectives = ddl::runtime::make_gloo_collectives(rank, size, *rt->store, interface_host(rt->placement.num_nodes), config.timeout);
  rt->engine = std::make_shared<Engine>(std::move(collectives), config);
  return rt;
}

// The collectives among a process set's members, rendezvousing under the set's own keys.
std::unique_ptr<ddl::runtime::Collectives> process_set_collectives(Runtime& rt, const std::string& prefix, const ProcessSet& set,
                                                                   const ddl::runtime::EngineConfig& config) {
  const int size = static_cast<int>(set.ranks.size());
  if (rt.mode == "single") return ddl::runtime::make_single_process_collectives();
  std::unique_ptr<gloo::rendezvous::Store> pmix_store;
  gloo::rendezvous::Store* world = rt.store.get();
  if (rt.pmix) {  // the world store's wait() is a fence every rank of the world must join
    pmix_store = rt.pmix->gloo_store(std::to_string(rt.generation), /*fence_on_wait=*/false);
    world = pmix_store.get();
  }
  auto store = ddl::runtime::make_subgroup_store(*world, prefix, set.ranks, /*forward_wait=*/!rt.pmix, config.timeout);
  std::unique_ptr<ddl::runtime::Collectives> collectives;
  if (rt.shared_memory) collectives = ddl::runtime::make_shared_memory_collectives(set.rank, size, *store, config.timeout);
  if (!collectives)
    collectives = ddl::runtime::make_gloo_collectives(set.rank, size, *store, interface_host(rt.placement.num_nodes), config.timeout);
  return collectives;
}

// Runs `body` with the runtime, turning "not initialized" and exceptions into statuses.
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
    auto rt = runtime();
    if (!rt) return fail(DDL_ERROR_NOT_INITIALIZED, "ddl_init() has not been called (or ddl_finalize() has)");
    return body(*rt);
  });
}

// Whether `count` elements of `dtype`, `times` over, are more bytes than a size_t counts: such an op
// would wrap around, touch a few bytes and report success.
bool too_many_bytes(uint64_t count, ddl_dtype dtype, uint64_t times = 1) {
  const uint64_t element = ddl::runtime::dtype_size(dtype);
  return element != 0 && times != 0 && count > std::numeric_limits<size_t>::max() / element / times;
}

// The sum of `counts`, or the largest uint64_t where it wraps around (which the size checks refuse).
uint64_t sum_of(const size_t* counts, int n) {
  uint64_t total = 0;
  for (int i = 0; i < n; ++i)
    if (__builtin_add_overflow(total, counts[i], &total)) return std::numeric_limits<uint64_t>::max();
  return total;
}

ddl_status refuse_byte_count(uint64_t count, ddl_dtype dtype) {
  return fail(DDL_ERROR_INVALID_ARGUMENT,
              fmt::format("{} {} elements are more bytes than memory can hold (a count or a sum of counts that wrapped around?)", count,
                          ddl::runtime::dtype_name(dtype)));
}

// An allgather's output holds every rank's count: refused where its bytes do not fit in a size_t.
ddl_status check_gathered_size(const OpSpec& spec, int ranks) {
  if (spec.kind != OpKind::Allgather || !too_many_bytes(spec.count, spec.dtype, static_cast<uint64_t>(ranks))) return DDL_SUCCESS;
  return refuse_byte_count(spec.count * static_cast<uint64_t>(ranks), spec.dtype);
}

ddl_status check_common(const void* recv, size_t count, ddl_dtype dtype) {
  if (!ddl::runtime::valid_dtype(dtype)) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown dtype {}", static_cast<int>(dtype)));
  if (too_many_bytes(count, dtype)) return refuse_byte_count(count, dtype);
  if (recv == nullptr && count > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the buffer is NULL");
  return DDL_SUCCESS;
}

// check_common, plus the send buffer of an op that reads one.
ddl_status check_buffers(const void* send, const void* recv, size_t count, ddl_dtype dtype) {
  if (auto s = check_common(recv, count, dtype); s != DDL_SUCCESS) return s;
  if (send == nullptr && count > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the send buffer is NULL");
  return DDL_SUCCESS;
}

ddl_status check_reduce_op(ddl_reduce_op op) {
  if (!ddl::runtime::valid_reduce_op(op))
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown reduce op {}", static_cast<int>(op)));
  return DDL_SUCCESS;
}

ddl_status check_root(int root) {
  int size = 0;
  if (auto s = ddl_size(&size); s != DDL_SUCCESS) return s;
  if (root < 0 || root >= size)
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("broadcast root {} is not a rank of a world of {}", root, size));
  return DDL_SUCCESS;
}

// Runs the op on the calling thread until it is done (Engine::run).
ddl_status run_to_completion(Engine& engine, const char* name, OpSpec spec, const void* send, void* recv, void* stream = nullptr) {
  std::string message;
  const ddl_status status = engine.run(name ? name : "", std::move(spec), send, recv, message, stream);
  return status == DDL_SUCCESS ? status : fail(status, message);
}

// The blocking forms pass this as the handle of the asynchronous forms they share their checks
// with: the op then runs to completion instead of being submitted. No caller can pass it.
ddl_handle g_no_handle_slot = nullptr;
ddl_handle* const kRunToCompletion = &g_no_handle_slot;

// The handle of an op just submitted to the engine. An op the engine refused at once (its name
// already in flight, after ddl_finalize, a broken world) fails here instead, with no handle, as
// Horovod refuses it at enqueue rather than at the wait. An op that was taken but has already run
// and failed by now (a mismatch found in a quick round) still gets its handle: only the wait
// reports how an op ran, whatever the timing.
ddl_status handle_of(Engine& engine, std::shared_ptr<ddl::runtime::OpState> state, ddl_handle* handle) {
  if (state->refused()) {
    std::string message;
    const ddl_status status = state->wait(message);  // before `message` is read: fail()'s arguments have no order
    return fail(status, message);
  }
  *handle = new ddl_handle_s{std::move(state), engine.weak_from_this()};
  return DDL_SUCCESS;
}

// An op's status once it is done. The waiting thread runs the engine's rounds itself where it can
// (Engine::run_rounds_until_done), holding the engine only meanwhile: were it held while sleeping,
// a ddl_finalize on another thread would leave the engine to be destroyed on this one. After
// finalize the engine is gone and the op long done.
ddl_status wait_for(ddl_handle_s& handle, std::string& message) {
  return guarded("ddl_wait", [&] {
    if (!handle.state->done())
      if (std::shared_ptr<Engine> engine = handle.engine.lock()) engine->run_rounds_until_done(*handle.state);
    return handle.state->wait(message);
  });
}

ddl_status submit(const char* name, OpSpec spec, const void* send, void* recv, ddl_handle* handle, void* stream = nullptr) {
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    if (auto s = check_gathered_size(spec, rt.engine->size()); s != DDL_SUCCESS) return s;
    if (handle == kRunToCompletion) return run_to_completion(*rt.engine, name, std::move(spec), send, recv);
    return handle_of(*rt.engine, rt.engine->submit(name ? name : "", std::move(spec), send, recv, stream), handle);
  });
}

// Gloo writes to its peers with writev(), which cannot ask for MSG_NOSIGNAL: without this a peer
// that dies mid-collective would kill the survivors with SIGPIPE instead of giving them an error.
// A handler the program installed itself is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

extern "C" {

ddl_status ddl_init(void) {
  std::lock_guard lock(g_mutex);
  if (g_runtime) return DDL_SUCCESS;
  ignore_sigpipe_unless_handled();
  try {
    g_runtime = start_runtime(g_generation++);
    return DDL_SUCCESS;
  } catch (const std::exception& e) {
    return fail(DDL_ERROR_BOOTSTRAP, fmt::format("ddl_init failed: {}", e.what()));
  }
}

ddl_status ddl_finalize(void) {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard lock(g_mutex);
    rt = std::move(g_runtime);
  }
  if (!rt) return fail(DDL_ERROR_NOT_INITIALIZED, "ddl_finalize() without ddl_init()");
  {
    std::lock_guard lock(rt->sets_mutex);
    for (auto& [id, set] : rt->sets)
      if (set->engine) set->engine->finalize();
    for (auto& engine : rt->retiring) engine->finalize();
  }
  rt->engine->finalize();
  return DDL_SUCCESS;
}

int ddl_is_initialized(void) { return runtime() != nullptr; }

#define DDL_WORLD_GETTER(fn, expr)                                                    \
  ddl_status fn(int* out) {                                                           \
    if (out == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, #fn ": NULL output"); \
    return with_runtime([&](Runtime& rt) {                                            \
      *out = (expr);                                                                  \
      return DDL_SUCCESS;                                                             \
    });                                                                               \
  }
DDL_WORLD_GETTER(ddl_rank, rt.engine->rank())
DDL_WORLD_GETTER(ddl_size, rt.engine->size())
DDL_WORLD_GETTER(ddl_local_rank, rt.placement.local_rank)
DDL_WORLD_GETTER(ddl_local_size, rt.placement.local_size)
DDL_WORLD_GETTER(ddl_node_rank, rt.placement.node_rank)
#undef DDL_WORLD_GETTER

const char* ddl_last_error(void) { return t_last_error.c_str(); }

const char* ddl_version(void) { return DDL_VERSION_STRING; }

const char* ddl_status_string(ddl_status status) {
  switch (status) {
    case DDL_SUCCESS: return "success";
    case DDL_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case DDL_ERROR_NOT_INITIALIZED: return "not initialized";
    case DDL_ERROR_MISMATCH: return "mismatch between ranks";
    case DDL_ERROR_TIMEOUT: return "timed out";
    case DDL_ERROR_PEER_FAILED: return "peer failed";
    case DDL_ERROR_BOOTSTRAP: return "bootstrap failed";
    case DDL_ERROR_INTERNAL: return "internal error";
    case DDL_ERROR_UNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}

size_t ddl_dtype_size(ddl_dtype dtype) { return ddl::runtime::valid_dtype(dtype) ? ddl::runtime::dtype_size(dtype) : 0; }

ddl_status ddl_allreduce_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                               ddl_handle* handle) {
  return ddl_allreduce_flags_async(name, send, recv, count, dtype, op, 0, handle);
}

ddl_status ddl_allreduce_flags_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                     unsigned flags, ddl_handle* handle) {
  if (flags & ~DDL_COMPRESS_FP16) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown allreduce flags {:#x}", flags));
  const bool compress = (flags & DDL_COMPRESS_FP16) != 0;
  if (compress && dtype != DDL_FLOAT32)
    return fail(DDL_ERROR_INVALID_ARGUMENT,
                fmt::format("DDL_COMPRESS_FP16 applies to float32 allreduces, not {}", ddl::runtime::dtype_name(dtype)));
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_reduce_op(op); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Allreduce, dtype, op, 0, count, {}, false, compress}, send, recv, handle);
}

ddl_status ddl_broadcast_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, ddl_handle* handle) {
  if (auto s = check_common(buffer, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_root(root); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Broadcast, dtype, DDL_SUM, root, count, {}}, buffer, buffer, handle);
}

ddl_status ddl_allgather_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle) {
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Allgather, dtype, DDL_SUM, 0, count, {}}, send, recv, handle);
}

ddl_status ddl_allgatherv_async(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                                ddl_dtype dtype, ddl_handle* handle) {
  int size = 0, rank = 0;
  if (auto s = ddl_size(&size); s != DDL_SUCCESS) return s;
  ddl_rank(&rank);
  if (recv_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "recv_counts is NULL");
  if (send == nullptr && send_count > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "allgatherv: the send buffer is NULL");
  std::vector<uint64_t> counts(recv_counts, recv_counts + size);
  const uint64_t total = sum_of(recv_counts, size);
  if (auto s = check_common(recv, total, dtype); s != DDL_SUCCESS) return s;
  if (counts[static_cast<size_t>(rank)] != send_count)
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("allgatherv: send_count {} differs from recv_counts[{}] = {}", send_count, rank,
                                                        counts[static_cast<size_t>(rank)]));
  // The spec holds what every rank agrees on: the total and the per-rank counts, not this rank's own.
  return submit(name, {OpKind::Allgatherv, dtype, DDL_SUM, 0, total, counts}, send, recv, handle);
}

ddl_status ddl_alltoall_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle) {
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Alltoall, dtype, DDL_SUM, 0, count, {}}, send, recv, handle);
}

ddl_status ddl_allreduce_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                    void* stream, ddl_handle* handle) {
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_reduce_op(op); s != DDL_SUCCESS) return s;
  if (dtype == DDL_INT16) return fail(DDL_ERROR_UNSUPPORTED, "NCCL cannot reduce int16 CUDA buffers");
  return submit(name, {OpKind::Allreduce, dtype, op, 0, count, {}, true}, send, recv, handle, stream);
}

ddl_status ddl_broadcast_cuda_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, void* stream,
                                    ddl_handle* handle) {
  if (auto s = check_common(buffer, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_root(root); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Broadcast, dtype, DDL_SUM, root, count, {}, true}, buffer, buffer, handle, stream);
}

ddl_status ddl_allgather_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream,
                                    ddl_handle* handle) {
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  return submit(name, {OpKind::Allgather, dtype, DDL_SUM, 0, count, {}, true}, send, recv, handle, stream);
}

const char* ddl_nccl_version(void) { return ddl::runtime::nccl_library().version.c_str(); }
const char* ddl_nccl_path(void) { return ddl::runtime::nccl_library().path.c_str(); }
const char* ddl_nccl_origin(void) { return ddl::runtime::nccl_library().origin.c_str(); }
const char* ddl_nccl_error(void) { return ddl::runtime::nccl_library().error.c_str(); }

int ddl_has_pmix(void) { return ddl::runtime::pmix_compiled_in() ? 1 : 0; }

ddl_status ddl_allreduce(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op) {
  return ddl_allreduce_async(name, send, recv, count, dtype, op, kRunToCompletion);
}
ddl_status ddl_broadcast(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root) {
  return ddl_broadcast_async(name, buffer, count, dtype, root, kRunToCompletion);
}
ddl_status ddl_allgather(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  return ddl_allgather_async(name, send, recv, count, dtype, kRunToCompletion);
}
ddl_status ddl_allgatherv(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts, ddl_dtype dtype) {
  return ddl_allgatherv_async(name, send, send_count, recv, recv_counts, dtype, kRunToCompletion);
}
ddl_status ddl_alltoall(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  return ddl_alltoall_async(name, send, recv, count, dtype, kRunToCompletion);
}
ddl_status ddl_barrier(void) {
  return submit(nullptr, {OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, nullptr, nullptr, kRunToCompletion);
}

// ---- Process sets and the *_ex operations ----

}  // extern "C"

namespace {

// Why a sorted list of ranks cannot be a process set of a world of `world` ranks ("" if it can).
std::string invalid_set_ranks(const std::vector<int>& sorted, int world) {
  if (sorted.empty()) return "a process set needs at least one rank";
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world) return fmt::format("rank {} is not a rank of a world of {}", sorted[i], world);
    if (i > 0 && sorted[i] == sorted[i - 1]) return fmt::format("rank {} is listed twice", sorted[i]);
  }
  return "";
}

// FNV-1a of a sorted rank list, so members can compare lists in one allgather.
uint64_t ranks_digest(const std::vector<int>& sorted) {
  uint64_t digest = 1469598103934665603ull;
  for (int r : sorted) digest = (digest ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return digest;
}

}  // namespace

extern "C" {

ddl_status ddl_process_set_create(const int* ranks, int count, ddl_process_set* out) {
  if (out == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_process_set_create: NULL output");
  return with_runtime([&](Runtime& rt) {
    const int world = rt.engine->size();
    std::vector<int> sorted;
    if (ranks != nullptr && count > 0) sorted.assign(ranks, ranks + count);
    std::sort(sorted.begin(), sorted.end());
    const std::string local_error = invalid_set_ranks(sorted, world);
    // Every rank takes an id and joins the agreement, even one whose own list is invalid: a rank
    // that returned early would number its later sets differently from the others.
    uintptr_t id = 0;
    {
      std::lock_guard lock(rt.sets_mutex);
      id = rt.next_set_id++;
    }
    // Every rank must have asked for the same valid set: compare digests of the lists across the world.
    constexpr uint64_t kInvalid = 0;
    uint64_t digest = ranks_digest(sorted);
    if (!local_error.empty() || digest == kInvalid) digest = local_error.empty() ? 1 : kInvalid;
    std::vector<uint64_t> digests(static_cast<size_t>(world));
    auto name = fmt::format("ddl.process_set_create.{}", id);
    if (auto st = run_to_completion(*rt.engine, name.c_str(), {OpKind::Allgather, DDL_INT64, DDL_SUM, 0, 1, {}}, &digest, digests.data());
        st != DDL_SUCCESS)
      return st;
    if (!local_error.empty()) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_process_set_create: " + local_error);
    std::vector<int> invalid, differing;
    for (int r = 0; r < world; ++r) {
      if (digests[static_cast<size_t>(r)] == kInvalid)
        invalid.push_back(r);
      else if (digests[static_cast<size_t>(r)] != digest)
        differing.push_back(r);
    }
    if (!invalid.empty())
      return fail(DDL_ERROR_MISMATCH, fmt::format("ddl_process_set_create: ranks {} asked for an invalid set (their own error says why)",
                                                  fmt::join(invalid, ",")));
    if (!differing.empty())
      return fail(DDL_ERROR_MISMATCH, fmt::format("ddl_process_set_create: ranks {} asked for a different set of ranks than rank {}",
                                                  fmt::join(differing, ","), rt.engine->rank()));
    auto set = std::make_shared<ProcessSet>();
    set->ranks = sorted;
    auto me = std::find(sorted.begin(), sorted.end(), rt.engine->rank());
    if (me != sorted.end()) {
      set->rank = static_cast<int>(me - sorted.begin());
      try {
        auto config = engine_config(rt.engine->rank());
        config.timeline_path.clear();  // the world's engine owns the timeline file
        config.world_ranks = set->ranks;
        set->engine = std::make_shared<Engine>(process_set_collectives(rt, fmt::format("set{}", id), *set, config), config);
      } catch (const std::exception& e) {
        return fail(DDL_ERROR_BOOTSTRAP,
                    fmt::format("ddl_process_set_create: connecting ranks {} failed: {}", fmt::join(sorted, ","), e.what()));
      }
    }
    std::lock_guard lock(rt.sets_mutex);
    rt.sets.emplace(id, std::move(set));
    *out = reinterpret_cast<ddl_process_set>(id);  // NOLINT(performance-no-int-to-ptr): the handle is an id, never dereferenced
    return DDL_SUCCESS;
  });
}

}  // extern "C"

namespace {

// Why `key` cannot name a set made by its members ("" if it can): it becomes part of store keys.
std::string invalid_set_key(const char* key) {
  if (key == nullptr || *key == '\0') return "a set made by its members needs a key that names it";
  const std::string_view k(key);
  if (k.size() > 200) return "its key is longer than 200 characters";
  for (char c : k)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != ':')
      return fmt::format("its key '{}' may hold only letters, digits and . _ - :", k);
  return "";
}

// The members' lists, compared through the new set's own engine: "" if they all agree.
std::string disagreeing_members(Engine& engine, const std::string& key, const std::vector<int>& sorted) {
  uint64_t digest = ranks_digest(sorted);
  std::vector<uint64_t> digests(sorted.size());
  auto name = fmt::format("ddl.process_set_create_among.{}", key);
  if (run_to_completion(engine, name.c_str(), {OpKind::Allgather, DDL_INT64, DDL_SUM, 0, 1, {}}, &digest, digests.data()) != DDL_SUCCESS)
    return t_last_error;
  std::vector<int> differing;
  for (size_t i = 0; i < sorted.size(); ++i)
    if (digests[i] != digest) differing.push_back(sorted[i]);
  if (differing.empty()) return "";
  return fmt::format("ranks {} asked for a different set of ranks than rank {}", fmt::join(differing, ","), engine.rank());
}

}  // namespace

extern "C" {

ddl_status ddl_process_set_create_among(const int* ranks, int count, const char* key, double timeout_seconds, ddl_process_set* out) {
  if (out == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_process_set_create_among: NULL output");
  return with_runtime([&](Runtime& rt) {
    std::vector<int> sorted;
    if (ranks != nullptr && count > 0) sorted.assign(ranks, ranks + count);
    std::sort(sorted.begin(), sorted.end());
    std::string error = invalid_set_ranks(sorted, rt.engine->size());
    if (error.empty()) error = invalid_set_key(key);
    auto me = std::find(sorted.begin(), sorted.end(), rt.engine->rank());
    if (error.empty() && me == sorted.end())
      error = fmt::format("rank {} is not one of the ranks {}; only members make such a set", rt.engine->rank(), fmt::join(sorted, ","));
    if (!(timeout_seconds >= 0.0 && timeout_seconds <= 1e9)) error = fmt::format("timeout {} s is not from 0 to 1e9", timeout_seconds);
    if (!error.empty()) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_process_set_create_among: " + error);
    auto set = std::make_shared<ProcessSet>();
    set->ranks = sorted;
    set->rank = static_cast<int>(me - sorted.begin());
    set->members_only = true;
    auto config = engine_config(rt.engine->rank());
    config.timeline_path.clear();  // the world's engine owns the timeline file
    config.world_ranks = sorted;
    if (timeout_seconds > 0.0) config.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_seconds * 1000.0));
    try {
      set->engine = std::make_shared<Engine>(process_set_collectives(rt, fmt::format("among.{}/", key), *set, config), config);
    } catch (const std::exception& e) {
      return fail(DDL_ERROR_BOOTSTRAP, fmt::format("ddl_process_set_create_among: connecting ranks {} (key {}) failed: {}",
                                                   fmt::join(sorted, ","), key, e.what()));
    }
    if (auto disagreement = disagreeing_members(*set->engine, key, sorted); !disagreement.empty()) {
      set->engine->finalize();
      return fail(DDL_ERROR_MISMATCH, "ddl_process_set_create_among: " + disagreement);
    }
    std::lock_guard lock(rt.sets_mutex);
    const uintptr_t id = rt.next_member_set_id++;
    rt.sets.emplace(id, std::move(set));
    *out = reinterpret_cast<ddl_process_set>(id);  // NOLINT(performance-no-int-to-ptr): the handle is an id, never dereferenced
    return DDL_SUCCESS;
  });
}

}  // extern "C"

namespace {

// The set behind a handle (nullptr, with the error set, if there is none).
std::shared_ptr<ProcessSet> find_set(Runtime& rt, ddl_process_set handle) {
  std::lock_guard lock(rt.sets_mutex);
  auto it = rt.sets.find(reinterpret_cast<uintptr_t>(handle));
  if (it == rt.sets.end()) {
    fail(DDL_ERROR_INVALID_ARGUMENT,
         fmt::format("process set {} does not exist (it was destroyed, or ddl_finalize was called)", reinterpret_cast<uintptr_t>(handle)));
    return nullptr;
  }
  return it->second;
}

// Where an op on `set` runs: the world's engine for NULL, else the set's own.
struct Target {
  Engine* engine = nullptr;
  std::shared_ptr<Engine> keep;  // a set's engine stays alive while the op is submitted
  int rank = 0, size = 1;
};

ddl_status resolve(Runtime& rt, ddl_process_set handle, Target& t) {
  if (handle == nullptr) {
    t = {rt.engine.get(), nullptr, rt.engine->rank(), rt.engine->size()};
    return DDL_SUCCESS;
  }
  auto set = find_set(rt, handle);
  if (!set) return DDL_ERROR_INVALID_ARGUMENT;
  if (!set->engine)
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("rank {} is not a member of process set {} (ranks {})", rt.engine->rank(),
                                                        reinterpret_cast<uintptr_t>(handle), fmt::join(set->ranks, ",")));
  t = {set->engine.get(), set->engine, set->rank, static_cast<int>(set->ranks.size())};
  return DDL_SUCCESS;
}

const ddl_op_options kDefaultOptions = DDL_OP_OPTIONS_INIT;

ddl_status refuse_blocking(const char* function) {
  return fail(DDL_ERROR_INVALID_ARGUMENT,
              fmt::format("{}: DDL_BLOCKING applies to ddl_allreduce_ex, ddl_broadcast_ex, ddl_allgatherv_ex and "
                          "ddl_reducescatter_ex; wait on this op's handle instead",
                          function));
}

// The options, checked: known flags, a shape when ndim > 0, scaling only on host buffers.
ddl_status read_options(const ddl_op_options* given, ddl_op_options& o, std::vector<int64_t>& shape) {
  o = given ? *given : kDefaultOptions;
  if (o.flags & ~(DDL_COMPRESS_FP16 | DDL_CUDA_BUFFERS | DDL_BLOCKING | DDL_ORDERED))
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown op flags {:#x}", o.flags));
  if (o.ndim < 0 || (o.ndim > 0 && o.shape == nullptr)) return fail(DDL_ERROR_INVALID_ARGUMENT, "options: ndim > 0 needs a shape");
  shape.assign(o.shape, o.shape + o.ndim);
  if ((o.flags & DDL_CUDA_BUFFERS) && (o.prescale != 1.0 || o.postscale != 1.0))
    return fail(DDL_ERROR_UNSUPPORTED, "prescale and postscale apply to host buffers; scale CUDA buffers on their stream");
  return DDL_SUCCESS;
}

constexpr size_t kCallSiteBytes = 256;  // of ddl_op_options.call_site: what ranks compare and announce

// What the options add to the spec every rank agrees on: the group the op belongs to, and whether
// its name is its place in an order (unnamed ops are, whatever the flag says).
OpSpec agreed(OpSpec spec, const ddl_op_options& o) {
  spec.group_size = o.group_size;
  spec.ordered = (o.flags & DDL_ORDERED) != 0;
  if (o.call_site != nullptr) spec.call_site.assign(o.call_site, ::strnlen(o.call_site, kCallSiteBytes));
  return spec;
}

ddl_status submit_to(Target& t, const char* name, OpSpec spec, const void* send, void* recv, ddl_handle* handle, void* stream,
                     unsigned flags = 0) {
  if (auto s = check_gathered_size(spec, t.size); s != DDL_SUCCESS) return s;
  if (flags & DDL_BLOCKING) {
    if (handle != nullptr) *handle = nullptr;
    return run_to_completion(*t.engine, name, std::move(spec), send, recv, stream);
  }
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return handle_of(*t.engine, t.engine->submit(name ? name : "", std::move(spec), send, recv, stream), handle);
}

}  // namespace

extern "C" {

ddl_status ddl_process_set_destroy(ddl_process_set handle) {
  return with_runtime([&](Runtime& rt) {
    auto set = find_set(rt, handle);
    if (!set) return DDL_ERROR_INVALID_ARGUMENT;
    {
      std::lock_guard lock(rt.sets_mutex);
      rt.sets.erase(reinterpret_cast<uintptr_t>(handle));
      if (set->engine && set->members_only) {  // local: the other members may release it later, or never
        set->engine->request_finalize();
        rt.retiring.push_back(set->engine);
        return DDL_SUCCESS;
      }
    }
    // Not under the lock: finalize waits for every member, and this rank's other threads may need
    // the sets meanwhile (an op on another set that those members wait for).
    if (set->engine) set->engine->finalize();
    return DDL_SUCCESS;
  });
}

}  // extern "C"

namespace {
// A question about a set: `world` answers it for NULL (the world), `read` for a set's handle.
template <typename World, typename Read>
ddl_status query_set(ddl_process_set handle, const void* out, const char* what, World world, Read read) {
  if (out == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL output", what));
  return with_runtime([&](Runtime& rt) {
    if (handle == nullptr) return world(rt);
    auto set = find_set(rt, handle);
    if (!set) return DDL_ERROR_INVALID_ARGUMENT;
    read(*set);
    return DDL_SUCCESS;
  });
}
}  // namespace

extern "C" {

ddl_status ddl_process_set_rank(ddl_process_set handle, int* rank) {
  return query_set(
      handle, rank, "ddl_process_set_rank", [&](Runtime&) { return ddl_rank(rank); }, [&](const ProcessSet& set) { *rank = set.rank; });
}

ddl_status ddl_process_set_size(ddl_process_set handle, int* size) {
  return query_set(
      handle, size, "ddl_process_set_size", [&](Runtime&) { return ddl_size(size); },
      [&](const ProcessSet& set) { *size = static_cast<int>(set.ranks.size()); });
}

ddl_status ddl_process_set_ranks(ddl_process_set handle, int* ranks) {
  return query_set(
      handle, ranks, "ddl_process_set_ranks",
      [&](Runtime& rt) {
        std::iota(ranks, ranks + rt.engine->size(), 0);
        return DDL_SUCCESS;
      },
      [&](const ProcessSet& set) { std::copy(set.ranks.begin(), set.ranks.end(), ranks); });
}

ddl_status ddl_allreduce_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                            const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_reduce_op(op); s != DDL_SUCCESS) return s;
  const bool compress = (o.flags & DDL_COMPRESS_FP16) != 0;
  if (compress && dtype != DDL_FLOAT32)
    return fail(DDL_ERROR_INVALID_ARGUMENT,
                fmt::format("DDL_COMPRESS_FP16 applies to float32 allreduces, not {}", ddl::runtime::dtype_name(dtype)));
  if ((o.flags & DDL_CUDA_BUFFERS) && dtype == DDL_INT16) return fail(DDL_ERROR_UNSUPPORTED, "NCCL cannot reduce int16 CUDA buffers");
  if ((o.flags & DDL_CUDA_BUFFERS) && (o.prescale != 1.0 || o.postscale != 1.0))
    return fail(DDL_ERROR_UNSUPPORTED,
                "prescale and postscale apply to host buffers: scale CUDA buffers on the device before or after the op");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::Allreduce, dtype,      op,         0, count, {}, (o.flags & DDL_CUDA_BUFFERS) != 0, compress,
                std::move(shape),  o.prescale, o.postscale};
    return submit_to(t, name, agreed(std::move(spec), o), send, recv, handle, o.stream, o.flags);
  });
}

ddl_status ddl_broadcast_ex(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, const ddl_op_options* options,
                            ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (auto s = check_common(buffer, count, dtype); s != DDL_SUCCESS) return s;
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    if (root < 0 || root >= t.size)
      return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("broadcast root {} is not a rank of a set of {}", root, t.size));
    OpSpec spec{OpKind::Broadcast, dtype, DDL_SUM, root, count, {}, (o.flags & DDL_CUDA_BUFFERS) != 0, false, std::move(shape)};
    return submit_to(t, name, agreed(std::move(spec), o), buffer, buffer, handle, o.stream, o.flags);
  });
}

ddl_status ddl_allgatherv_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                             const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (recv_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    std::vector<uint64_t> counts(recv_counts, recv_counts + t.size);
    const uint64_t total = sum_of(recv_counts, t.size);
    // The send buffer holds this rank's count only: none may come as NULL (refusing it left the
    // other ranks waiting for this one).
    if (auto s = check_common(recv, total, dtype); s != DDL_SUCCESS) return s;
    if (counts[static_cast<size_t>(t.rank)] > 0 && send == nullptr)
      return fail(DDL_ERROR_INVALID_ARGUMENT, "allgatherv: the send buffer is NULL");
    const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;
    if (cuda) {  // NCCL gathers equal blocks only
      if (std::any_of(counts.begin(), counts.end(), [&](uint64_t c) { return c != counts[0]; }))
        return fail(DDL_ERROR_UNSUPPORTED, "allgatherv of CUDA buffers needs equal counts on every rank");
      return submit_to(t, name, agreed({OpKind::Allgather, dtype, DDL_SUM, 0, counts[0], {}, true, false, std::move(shape)}, o), send, recv,
                       handle, o.stream, o.flags);
    }
    return submit_to(t, name, agreed({OpKind::Allgatherv, dtype, DDL_SUM, 0, total, counts, false, false, std::move(shape)}, o), send, recv,
                     handle, nullptr, o.flags);
  });
}

ddl_status ddl_alltoallv_ex(const char* name, const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                            ddl_dtype dtype, const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (o.flags & DDL_BLOCKING) return refuse_blocking("ddl_alltoallv_ex");
  if (send_counts == nullptr || recv_counts == nullptr)
    return fail(DDL_ERROR_INVALID_ARGUMENT, "alltoallv: send_counts or recv_counts is NULL");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    const auto n = static_cast<size_t>(t.size);
    if (auto s = check_common(recv, sum_of(recv_counts, t.size), dtype); s != DDL_SUCCESS) return s;
    if (sum_of(send_counts, t.size) > 0 && send == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "alltoallv: the send buffer is NULL");
    const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;  // NCCL sends and receives, on o.stream
    OpSpec spec{OpKind::Alltoallv, dtype, DDL_SUM, 0, 0, {}, cuda, false, std::move(shape)};
    return handle_of(
        *t.engine,
        t.engine->submit_with_counts(name ? name : "", agreed(spec, o), send, recv, std::vector<size_t>(send_counts, send_counts + n),
                                     std::vector<size_t>(recv_counts, recv_counts + n), cuda ? o.stream : nullptr),
        handle);
  });
}

ddl_status ddl_allgather_any_ex(const char* name, const void* send, size_t send_count, ddl_dtype dtype, const ddl_op_options* options,
                                ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (o.flags & DDL_CUDA_BUFFERS) return fail(DDL_ERROR_UNSUPPORTED, "ddl_allgather_any_ex takes host buffers");
  if (o.flags & DDL_BLOCKING) return refuse_blocking("ddl_allgather_any_ex");
  if (auto s = check_common(send, send_count, dtype); s != DDL_SUCCESS) return s;
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::AllgatherAny, dtype, DDL_SUM, 0, 0, {}, false, false, std::move(shape)};
    return handle_of(*t.engine, t.engine->submit_with_counts(name ? name : "", agreed(spec, o), send, nullptr, {send_count}, {}), handle);
  });
}

ddl_status ddl_alltoall_any_ex(const char* name, const void* send, const size_t* send_counts, ddl_dtype dtype,
                               const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (o.flags & DDL_CUDA_BUFFERS) return fail(DDL_ERROR_UNSUPPORTED, "ddl_alltoall_any_ex takes host buffers");
  if (o.flags & DDL_BLOCKING) return refuse_blocking("ddl_alltoall_any_ex");
  if (send_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_alltoall_any_ex: send_counts is NULL");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    if (auto s = check_common(send, sum_of(send_counts, t.size), dtype); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::AlltoallAny, dtype, DDL_SUM, 0, 0, {}, false, false, std::move(shape)};
    return handle_of(*t.engine,
                     t.engine->submit_with_counts(name ? name : "", agreed(spec, o), send, nullptr,
                                                  std::vector<size_t>(send_counts, send_counts + t.size), {}),
                     handle);
  });
}

ddl_status ddl_gathered(ddl_handle handle, size_t* counts, const void** data) {
  if (handle == nullptr || counts == nullptr || data == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_gathered: NULL argument");
  std::string message;
  ddl_status status = wait_for(*handle, message);
  if (status != DDL_SUCCESS) return fail(status, message);
  const auto& c = handle->state->gathered_counts();
  if (c.empty()) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_gathered: the handle is not a ddl_allgather_any_ex or ddl_alltoall_any_ex");
  std::copy(c.begin(), c.end(), counts);
  *data = handle->state->gathered().data();
  return DDL_SUCCESS;
}

ddl_status ddl_reducescatter_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                                ddl_reduce_op op, const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;
  if (recv_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "reducescatter: recv_counts is NULL");
  if (auto s = check_reduce_op(op); s != DDL_SUCCESS) return s;
  if (cuda && dtype == DDL_INT16) return fail(DDL_ERROR_UNSUPPORTED, "NCCL cannot reduce int16 CUDA buffers");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    std::vector<uint64_t> counts(recv_counts, recv_counts + t.size);
    const uint64_t total = sum_of(recv_counts, t.size);
    // The output holds this rank's share only: none (fewer rows than ranks) may come as NULL, as
    // an empty tensor's storage does; refusing it here left the other ranks waiting for this one.
    if (auto s = check_common(recv, counts[static_cast<size_t>(t.rank)], dtype); s != DDL_SUCCESS) return s;
    if (too_many_bytes(total, dtype)) return refuse_byte_count(total, dtype);
    if (send == nullptr && total > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the send buffer is NULL");
    OpSpec spec{OpKind::Reducescatter, dtype, op, 0, total, counts, cuda, false, std::move(shape), o.prescale, o.postscale};
    return submit_to(t, name, agreed(std::move(spec), o), send, recv, handle, cuda ? o.stream : nullptr, o.flags);
  });
}

ddl_status ddl_join(ddl_process_set set, int* last_rank) {
  if (last_rank == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_join: NULL output");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, set, t); s != DDL_SUCCESS) return s;
    auto state = t.engine->submit("ddl.join", {OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, nullptr, nullptr);
    std::string message;
    if (ddl_status s = state->wait(message); s != DDL_SUCCESS) return fail(s, message);
    *last_rank = static_cast<int>(state->gathered_counts().at(0));
    return DDL_SUCCESS;
  });
}

ddl_status ddl_fail_ex(const char* name, const char* reason, const ddl_op_options* options, ddl_handle* handle) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  if (reason == nullptr || *reason == '\0') return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_fail_ex: the reason is NULL or empty");
  if (o.flags & DDL_BLOCKING) return refuse_blocking("ddl_fail_ex");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    // A barrier's spec carries the reason: it is never run (the negotiator fails it on every rank).
    OpSpec spec = agreed({OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, o);
    spec.failure = reason;
    return handle_of(*t.engine, t.engine->submit(name ? name : "", std::move(spec), nullptr, nullptr), handle);
  });
}

ddl_status ddl_barrier_ex(ddl_process_set set, ddl_handle* handle) {
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, set, t); s != DDL_SUCCESS) return s;
    // A NULL handle: the blocking barrier of the set.
    return submit_to(t, nullptr, {OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, nullptr, nullptr, handle, nullptr,
                     handle == nullptr ? DDL_BLOCKING : 0u);
  });
}

ddl_status ddl_timeline_start(const char* path) {
  if (path == nullptr || *path == '\0') return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_timeline_start: empty path");
  return with_runtime([&](Runtime& rt) {
    const std::string mine = timeline_path_for(path, rt.engine->rank());
    if (mine.empty()) {  // another rank writes it; this one's earlier file (a %r path) ends here
      rt.engine->timeline().close();
      return DDL_SUCCESS;
    }
    if (!rt.engine->timeline().open(mine))
      return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("ddl_timeline_start: cannot write '{}': {}", mine, std::strerror(errno)));
    return DDL_SUCCESS;
  });
}

ddl_status ddl_timeline_stop(void) {
  return with_runtime([&](Runtime& rt) {
    rt.engine->timeline().close();
    return DDL_SUCCESS;
  });
}

ddl_status ddl_wait(ddl_handle handle) {
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_wait: NULL handle");
  std::unique_ptr<ddl_handle_s> owned(handle);
  std::string message;
  ddl_status status = wait_for(*owned, message);
  return status == DDL_SUCCESS ? status : fail(status, message);
}

ddl_status ddl_test(ddl_handle handle, int* done) {
  if (handle == nullptr || done == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_test: NULL handle or output");
  *done = handle->state->done() ? 1 : 0;
  return DDL_SUCCESS;
}

}  // extern "C"
