// The C API of libddl (ddl/ddl.h): argument checks, the process-wide runtime, thread-local errors.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>
#include <gloo/rendezvous/store.h>

#include "ddl/ddl.h"
#include "runtime/src/backends/collectives.hpp"
#include "runtime/src/backends/gpu_collectives.hpp"
#include "runtime/src/backends/pmix_bootstrap.hpp"
#include "runtime/src/common/error.hpp"
#include "runtime/src/engine/dtype.hpp"
#include "runtime/src/engine/engine.hpp"
#include "runtime/src/store/tcp_store_client.hpp"

struct ddl_handle_s {
  std::shared_ptr<ddl::runtime::OpState> state;
};

namespace {

using ddl::runtime::Engine;
using ddl::runtime::OpKind;
using ddl::runtime::OpSpec;

struct Placement {
  int local_rank = 0, local_size = 1, node_rank = 0, num_nodes = 1;
};

struct Runtime {
  Placement placement;
  std::unique_ptr<ddl::runtime::PmixSession> pmix;  // while bootstrapped through PMIx
  std::unique_ptr<Engine> engine;                   // destroyed before pmix
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
  long n = std::strtol(v, &end, 10);
  if (*end != '\0') throw ddl::Error(fmt::format("{}='{}' is not a whole number", name, v));
  return static_cast<int>(n);
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (*end != '\0' || d < 0) throw ddl::Error(fmt::format("{}='{}' is not a non-negative number", name, v));
  return d;
}

ddl::runtime::EngineConfig engine_config(int rank) {
  ddl::runtime::EngineConfig c;
  c.cycle_time = std::chrono::microseconds(static_cast<long long>(env_double("DDL_CYCLE_TIME_MS", 1) * 1000));
  c.fusion_threshold = static_cast<size_t>(env_double("DDL_FUSION_THRESHOLD", 64.0 * 1024 * 1024));
  c.timeout = std::chrono::milliseconds(static_cast<long long>(env_double("DDL_TIMEOUT", 300) * 1000));
  if (const char* t = std::getenv("DDL_TIMELINE"); t != nullptr && *t != '\0') {
    // "%r" in the path becomes the rank, so every rank can write its own; otherwise rank 0 writes.
    std::string path = t;
    auto at = path.find("%r");
    if (at != std::string::npos) c.timeline_path = path.replace(at, 2, std::to_string(rank));
    else if (rank == 0) c.timeline_path = path;
  }
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

// One node: peers are reached over loopback. Several: by this host's name.
std::string interface_host(int num_nodes) {
  if (num_nodes <= 1) return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::shared_ptr<Runtime> start_runtime(int generation) {
  auto rt = std::make_shared<Runtime>();
  const std::string mode = bootstrap_mode();
  if (mode == "single") {
    rt->engine = std::make_unique<Engine>(ddl::runtime::make_single_process_collectives(), engine_config(0));
    return rt;
  }
  int rank = 0, size = 1;
  std::unique_ptr<gloo::rendezvous::Store> store;
  if (mode == "store") {
    rank = env_int("DDL_RANK", -1);
    size = env_int("DDL_SIZE", -1);
    if (rank < 0 || size < 1 || rank >= size)
      throw ddl::Error("DDL_RANK and DDL_SIZE are missing or out of range: start the program with `ddl run`");
    rt->placement = {env_int("DDL_LOCAL_RANK", 0), env_int("DDL_LOCAL_SIZE", 1), env_int("DDL_NODE_RANK", 0),
                     env_int("DDL_NUM_NODES", 1)};
    store = ddl::runtime::make_tcp_gloo_store(ddl::store::TcpStoreClient::from_environment(), fmt::format("ddl/{}/gloo/", generation));
  } else {
    rt->pmix = std::make_unique<ddl::runtime::PmixSession>(engine_config(0).timeout);
    const auto& w = rt->pmix->world();
    rank = w.rank;
    size = w.size;
    // PMIx node ids need not count from 0; a world whose ranks all share this node is one node.
    rt->placement = {w.local_rank, w.local_size, w.local_size == w.size ? 0 : w.node_rank, w.local_size == w.size ? 1 : 2};
    store = rt->pmix->gloo_store(fmt::format("{}.", generation));
  }
  auto config = engine_config(rank);
  // All ranks on this node: shared memory, unless DDL_SHM=0; else (or if it cannot be set up) Gloo.
  std::unique_ptr<ddl::runtime::Collectives> collectives;
  const char* shm = std::getenv("DDL_SHM");
  if (rt->placement.local_size == size && !(shm != nullptr && std::string(shm) == "0"))
    collectives = ddl::runtime::make_shared_memory_collectives(rank, size, *store, config.timeout);
  if (!collectives)
    collectives = ddl::runtime::make_gloo_collectives(rank, size, *store, interface_host(rt->placement.num_nodes), config.timeout);
  rt->engine = std::make_unique<Engine>(std::move(collectives), config);
  return rt;
}

// Runs `body` with the runtime, turning "not initialized" and exceptions into statuses.
template <typename Body>
ddl_status with_runtime(Body body) {
  auto rt = runtime();
  if (!rt) return fail(DDL_ERROR_NOT_INITIALIZED, "ddl_init() has not been called (or ddl_finalize() has)");
  return body(*rt);
}

ddl_status check_common(const void* recv, size_t count, ddl_dtype dtype) {
  if (!ddl::runtime::valid_dtype(dtype)) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown dtype {}", static_cast<int>(dtype)));
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
  if (!ddl::runtime::valid_reduce_op(op)) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown reduce op {}", static_cast<int>(op)));
  return DDL_SUCCESS;
}

ddl_status check_root(int root) {
  int size = 0;
  if (auto s = ddl_size(&size); s != DDL_SUCCESS) return s;
  if (root < 0 || root >= size) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("broadcast root {} is not a rank of a world of {}", root, size));
  return DDL_SUCCESS;
}

ddl_status submit(const char* name, const OpSpec& spec, const void* send, void* recv, ddl_handle* handle, void* stream = nullptr) {
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_runtime([&](Runtime& rt) {
    *handle = new ddl_handle_s{rt.engine->submit(name ? name : "", spec, send, recv, stream)};
    return DDL_SUCCESS;
  });
}

// `handle` is read only after the submit call has filled it (argument order is unspecified).
ddl_status run_sync(ddl_status submitted, const ddl_handle* handle) {
  return submitted == DDL_SUCCESS ? ddl_wait(*handle) : submitted;
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
  rt->engine->finalize();
  return DDL_SUCCESS;
}

int ddl_is_initialized(void) { return runtime() != nullptr; }

#define DDL_WORLD_GETTER(fn, expr)                                                   \
  ddl_status fn(int* out) {                                                          \
    if (out == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, #fn ": NULL output"); \
    return with_runtime([&](Runtime& rt) {                                           \
      *out = (expr);                                                                 \
      return DDL_SUCCESS;                                                            \
    });                                                                              \
  }
DDL_WORLD_GETTER(ddl_rank, rt.engine->rank())
DDL_WORLD_GETTER(ddl_size, rt.engine->size())
DDL_WORLD_GETTER(ddl_local_rank, rt.placement.local_rank)
DDL_WORLD_GETTER(ddl_local_size, rt.placement.local_size)
DDL_WORLD_GETTER(ddl_node_rank, rt.placement.node_rank)
#undef DDL_WORLD_GETTER

const char* ddl_last_error(void) { return t_last_error.c_str(); }

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

ddl_status ddl_allreduce_flags_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                     ddl_reduce_op op, unsigned flags, ddl_handle* handle) {
  if (flags & ~DDL_COMPRESS_FP16) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown allreduce flags {:#x}", flags));
  const bool compress = (flags & DDL_COMPRESS_FP16) != 0;
  if (compress && dtype != DDL_FLOAT32)
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("DDL_COMPRESS_FP16 applies to float32 allreduces, not {}", ddl::runtime::dtype_name(dtype)));
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
  std::vector<uint64_t> counts(recv_counts, recv_counts + size);
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
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

ddl_status ddl_allreduce_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                    ddl_reduce_op op, void* stream, ddl_handle* handle) {
  if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
  if (auto s = check_reduce_op(op); s != DDL_SUCCESS) return s;
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

const char* ddl_nccl_version(void) {
  static const std::string version = ddl::runtime::nccl_version_compiled_in();
  return version.c_str();
}

int ddl_has_pmix(void) { return ddl::runtime::pmix_compiled_in() ? 1 : 0; }

ddl_status ddl_allreduce(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op) {
  ddl_handle h = nullptr;
  return run_sync(ddl_allreduce_async(name, send, recv, count, dtype, op, &h), &h);
}
ddl_status ddl_broadcast(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root) {
  ddl_handle h = nullptr;
  return run_sync(ddl_broadcast_async(name, buffer, count, dtype, root, &h), &h);
}
ddl_status ddl_allgather(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  ddl_handle h = nullptr;
  return run_sync(ddl_allgather_async(name, send, recv, count, dtype, &h), &h);
}
ddl_status ddl_allgatherv(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                          ddl_dtype dtype) {
  ddl_handle h = nullptr;
  return run_sync(ddl_allgatherv_async(name, send, send_count, recv, recv_counts, dtype, &h), &h);
}
ddl_status ddl_alltoall(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  ddl_handle h = nullptr;
  return run_sync(ddl_alltoall_async(name, send, recv, count, dtype, &h), &h);
}
ddl_status ddl_barrier(void) {
  ddl_handle h = nullptr;
  return run_sync(submit(nullptr, {OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, nullptr, nullptr, &h), &h);
}

ddl_status ddl_wait(ddl_handle handle) {
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_wait: NULL handle");
  std::unique_ptr<ddl_handle_s> owned(handle);
  std::string message;
  ddl_status status = owned->state->wait(message);
  return status == DDL_SUCCESS ? status : fail(status, message);
}

ddl_status ddl_test(ddl_handle handle, int* done) {
  if (handle == nullptr || done == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_test: NULL handle or output");
  *done = handle->state->done() ? 1 : 0;
  return DDL_SUCCESS;
}

}  // extern "C"
