// The C API's start-up and shutdown (ddl_init, ddl_finalize), what a rank knows of the world it
// joined, and the calls that describe the library: versions, status strings, NCCL, timelines.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/environment.hpp"
#include "common/error.hpp"
#include "common/net_address.hpp"
#include "common/worker_contract.hpp"
#include "ddl/ddl.h"
#include "rendezvous/gloo_store.hpp"
#include "rendezvous/pmix_store.hpp"
#include "rendezvous/tcp_store_client.hpp"
#include "runtime/src/api/api_state.hpp"
#include "runtime/src/core/dtype.hpp"
#include "runtime/src/transports/collectives.hpp"
#include "runtime/src/transports/nccl_library.hpp"

namespace ddl::api {
namespace {

std::mutex g_mutex;
// Never destroyed: a process that exits without ddl_finalize (say, after an error) must not wait
// at exit for the other ranks to finalize; its connections close and the peers see it leave.
std::shared_ptr<Runtime>& g_runtime = *new std::shared_ptr<Runtime>;
int g_generation = 0;  // keeps the store keys of successive ddl_init calls apart
thread_local std::string t_last_error;

}  // namespace

ddl_status fail(ddl_status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

const std::string& last_error() { return t_last_error; }

std::shared_ptr<Runtime> current_runtime() {
  std::lock_guard lock(g_mutex);
  return g_runtime;
}

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0') throw ddl::Error(fmt::format("{}='{}' is not a whole number", name, v));
  // Cast to int, 4294967296 would become rank 0: a second rank 0, silently.
  if (errno == ERANGE || n < INT_MIN || n > INT_MAX) throw ddl::Error(fmt::format("{}='{}' is out of range", name, v));
  return static_cast<int>(n);
}

// The file this rank writes a timeline to: "%r" in the path becomes the rank, so every rank can
// write its own; otherwise rank 0 writes and the others none (empty), as Horovod's coordinator does.
std::string timeline_path_for(std::string path, int rank) {
  if (path.find("%r") == std::string::npos) return rank == 0 ? path : std::string();
  const std::string number = std::to_string(rank);
  for (size_t at = path.find("%r"); at != std::string::npos; at = path.find("%r", at + number.size())) path.replace(at, 2, number);
  return path;
}

}  // namespace

runtime::EngineConfig engine_config(int rank) {
  runtime::EngineConfig c;
  c.cycle_time = std::chrono::microseconds(static_cast<long long>(ddl::number_from_environment(contract::kCycleTimeMs) * 1000));
  c.fusion_threshold = static_cast<size_t>(ddl::number_from_environment(contract::kFusionThreshold));
  c.timeout = ddl::timeout_from_environment();
  if (const char* t = std::getenv(contract::kTimeline); t != nullptr && *t != '\0') c.timeline_path = timeline_path_for(t, rank);
  if (const char* w = std::getenv(contract::kWatchDir); w != nullptr && *w != '\0')
    c.progress_path = fmt::format("{}/rank.{}.progress", w, rank);
  if (const char* s = std::getenv(contract::kReportStragglers); s != nullptr && *s != '\0') {
    c.report_stragglers = true;
    c.straggler_interval = std::chrono::seconds(ddl::whole_number(s, 365LL * 24 * 3600).value_or(0));
  }
  if (const char* v = std::getenv(contract::kCudaViaHost); v != nullptr) c.cuda_via_host = contract::flag_on(v);
  return c;
}

namespace {

// What says a launcher started this process as one of several, in a way libddl cannot join
// ("WORLD_SIZE=4 says torchrun ... started this process as one of 4"), if anything does.
std::optional<std::string> world_libddl_cannot_join() {
  static const std::pair<const char*, const char*> kLaunchers[] = {
      {"OMPI_COMM_WORLD_SIZE", "mpirun"},
      {"PMI_SIZE", "mpiexec"},
      {"SLURM_STEP_NUM_TASKS", "srun"},
      {"WORLD_SIZE", "torchrun, mp.spawn or a site's recipe"},
  };
  for (const auto& [name, launcher] : kLaunchers) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    char* end = nullptr;
    const long size = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && size > 1)
      return fmt::format("{}={} says {} started this process as one of {}", name, v, launcher, size);
  }
  return std::nullopt;
}

// store: `ddl run`'s store; pmix: a PMIx launcher; single: this process alone. A process that a
// launcher started as one of several, but that libddl cannot join, is refused: alone, each would
// train a model of its own and report success (DDL_BOOTSTRAP=single asks for that on purpose).
std::string bootstrap_mode() {
  const char* forced = std::getenv(contract::kBootstrap);
  if (forced != nullptr && *forced != '\0') {
    std::string mode = forced;
    if (mode != "store" && mode != "pmix" && mode != "single")
      throw ddl::Error(fmt::format("DDL_BOOTSTRAP='{}' is not one of store, pmix, single", mode));
    return mode;
  }
  if (std::getenv(contract::kStoreAddr) != nullptr) return "store";
  if (std::getenv("PMIX_RANK") != nullptr && ddl::runtime::pmix_compiled_in()) return "pmix";
  if (auto launched = world_libddl_cannot_join())
    throw ddl::Error(
        fmt::format("{}, but libddl cannot join the others from here{}: start the "
                    "program with `ddl run` (inside the allocation too), or, from torch, let init_process_group(\"ddl\") "
                    "or ddl.torch's init() join through torch's store (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); "
                    "DDL_BOOTSTRAP=single runs it alone on purpose",
                    *launched, std::getenv("PMIX_RANK") != nullptr ? " (this libddl was built without PMIx)" : ""));
  return "single";
}

std::string this_host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

// One node: peers are reached over loopback. Several: DDL_GLOO_ADDR, else this host's address on
// the route to `towards` (the store's host, or MASTER_ADDR for a program's store), else its name.
std::string interface_host(int num_nodes, const std::string& towards) {
  if (num_nodes <= 1) return "127.0.0.1";
  if (const char* given = std::getenv(contract::kGlooAddr); given != nullptr && *given != '\0') return given;
  if (!towards.empty()) {
    std::string route = ddl::address_towards(towards);
    if (!route.starts_with("127.")) return route;  // on `towards`' own host the route is loopback
  }
  return this_host_name();
}

namespace {

// The process that registered close_world_records_at_exit: a fork()ed child that exits runs it too.
pid_t g_records_owner = 0;

// A timeline is valid JSON only once closed, and most programs (Python scripts above all) exit
// without ddl_finalize: close the world's at exit, and give its straggler report. try_lock: a
// thread that holds g_mutex at exit may never let go of it. A fork()ed child leaves both to its
// parent and takes no lock at all: a thread of the parent's may have held the timeline's when it
// forked, and it never lets go in the child, which would hang at exit (and its parent with it).
void close_world_records_at_exit() {
  if (::getpid() != g_records_owner) return;
  std::unique_lock lock(g_mutex, std::try_to_lock);
  if (!lock.owns_lock() || !g_runtime || !g_runtime->engine) return;
  g_runtime->engine->timeline().close();
  g_runtime->engine->report_stragglers_at_exit();
}

// The world `ddl run` describes in its variables, through its store.
void join_through_ddl_run(Runtime& rt, int& rank, int& size) {
  rank = env_int(contract::kRank, -1);
  size = env_int(contract::kSize, -1);
  if (rank < 0 || size < 1 || rank >= size)
    throw ddl::Error("DDL_RANK and DDL_SIZE are missing or out of range: start the program with `ddl run`");
  rt.placement = {env_int(contract::kLocalRank, 0), env_int(contract::kLocalSize, 1), env_int(contract::kNodeRank, 0),
                  env_int(contract::kNumNodes, 1)};
  if (!rt.placement.consistent())
    throw ddl::Error("DDL_LOCAL_RANK, DDL_LOCAL_SIZE, DDL_NODE_RANK and DDL_NUM_NODES are out of range: start the program with `ddl run`");
  rt.store = ddl::runtime::make_tcp_gloo_store(ddl::store::TcpStoreClient::from_environment(), fmt::format("ddl/{}/gloo", rt.generation));
  const std::string addr = std::getenv(contract::kStoreAddr);
  rt.hosts_numbered_in_order = true;  // ddl run numbers ranks host by host
  rt.interface = interface_host(rt.placement.num_nodes, addr.substr(0, addr.rfind(':')));
}

void join_through_pmix(Runtime& rt, int& rank, int& size) {
  rt.pmix = std::make_unique<ddl::runtime::PmixSession>(ddl::timeout_from_environment());
  const auto& w = rt.pmix->world();
  rank = w.rank;
  size = w.size;
  // PMIx node ids need not count from 0; a world whose ranks all share this node is one node.
  rt.placement = {w.local_rank, w.local_size, w.local_size == w.size ? 0 : w.node_rank, w.local_size == w.size ? 1 : 2};
  rt.store = rt.pmix->gloo_store(std::to_string(rt.generation));
  rt.interface = interface_host(rt.placement.num_nodes, "");
}

// Where `rank` sits among the hosts the store's ranks named: ranks of one host share a node, and
// nodes are numbered by their lowest rank. Whether every host's ranks follow each other (0-3 on
// one host, 4-7 on the next) is what shared memory within hosts and Gloo between them needs.
Placement placement_among(const std::vector<std::string>& hosts, int rank, bool& numbered_host_by_host) {
  std::vector<std::string> nodes;  // in order of their lowest rank
  Placement p{0, 0, 0, 0};
  numbered_host_by_host = true;
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto node = std::find(nodes.begin(), nodes.end(), hosts[r]);
    if (node == nodes.end()) {
      nodes.push_back(hosts[r]);
      node = nodes.end() - 1;
    } else if (hosts[r] != hosts[r - 1]) {
      numbered_host_by_host = false;
    }
    if (hosts[r] != hosts[static_cast<size_t>(rank)]) continue;
    if (static_cast<int>(r) < rank) ++p.local_rank;
    ++p.local_size;
    p.node_rank = static_cast<int>(node - nodes.begin());
  }
  p.num_nodes = static_cast<int>(nodes.size());
  return p;
}

// The world a program's store describes: every rank writes its host's name and reads the others'.
void join_through_program_store(Runtime& rt, int rank, int size, const ddl::runtime::ProgramStore& program) {
  const auto timeout = ddl::timeout_from_environment();
  auto hosts_store = ddl::runtime::make_program_gloo_store(program, fmt::format("ddl/{}/host", rt.generation), timeout);
  const std::string mine = this_host_name();
  hosts_store->set(std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) {
    const std::vector<char> name = hosts_store->get(std::to_string(r));
    hosts.emplace_back(name.begin(), name.end());
  }
  rt.placement = placement_among(hosts, rank, rt.hosts_numbered_in_order);
  rt.store = ddl::runtime::make_program_gloo_store(program, fmt::format("ddl/{}/gloo", rt.generation), timeout);
  const char* master = std::getenv("MASTER_ADDR");
  rt.interface = interface_host(rt.placement.num_nodes, master != nullptr ? master : "");
}

// The collectives of a world whose placement is known: shared memory when every rank is on this
// node (unless DDL_SHM=0); shared memory within hosts and Gloo between them when hosts hold ranks
// numbered host by host; else Gloo.
std::unique_ptr<ddl::runtime::Collectives> world_collectives(Runtime& rt, int rank, int size, const runtime::EngineConfig& config) {
  std::unique_ptr<ddl::runtime::Collectives> collectives;
  const char* shm = std::getenv(contract::kShm);
  const bool shm_allowed = !(shm != nullptr && std::string(shm) == "0");
  if (rt.placement.local_size == size && shm_allowed)
    collectives = ddl::runtime::make_shared_memory_collectives(rank, size, *rt.store, config.timeout);
  rt.shared_memory = collectives != nullptr;
  const bool several_hosts = rt.mode != "pmix" && rt.placement.num_nodes > 1 && rt.hosts_numbered_in_order;
  if (!collectives && several_hosts && shm_allowed)
    collectives = ddl::runtime::make_hierarchical_collectives(rank, size, rt.placement.node_rank, *rt.store, rt.interface, config.timeout);
  if (!collectives) collectives = ddl::runtime::make_gloo_collectives(rank, size, *rt.store, rt.interface, config.timeout);
  return collectives;
}

// Every rank's host, for rank 0's straggler report (through the rendezvous store: no collective
// runs before the engine); empty on the other ranks.
std::vector<std::string> hosts_of_ranks(gloo::rendezvous::Store& store, int rank, int size) {
  const std::string host = this_host_name();
  store.set(fmt::format("straggler-host/{}", rank), std::vector<char>(host.begin(), host.end()));
  std::vector<std::string> hosts;
  if (rank != 0) return hosts;
  try {
    for (int r = 0; r < size; ++r) {
      const std::vector<char> named = store.get(fmt::format("straggler-host/{}", r));
      hosts.emplace_back(named.begin(), named.end());
    }
  } catch (const std::exception& e) {
    throw ddl::Error(fmt::format("DDL_REPORT_STRAGGLERS (--report-stragglers): rank {} did not name its host in the rendezvous store: {}",
                                 hosts.size(), e.what()));
  }
  return hosts;
}

// `program`: the program's store (ddl_init_with_store) and the rank and size it gave; else the
// world comes from ddl run, PMIx or this process alone (bootstrap_mode).
std::shared_ptr<Runtime> start_runtime(int generation, const ddl::runtime::ProgramStore* program = nullptr, int given_rank = 0,
                                       int given_size = 1) {
  static std::once_flag at_exit_registered;
  std::call_once(at_exit_registered, [] {
    g_records_owner = ::getpid();
    std::atexit(close_world_records_at_exit);
  });
  auto rt = std::make_shared<Runtime>();
  rt->mode = program != nullptr ? "program store" : bootstrap_mode();
  rt->generation = generation;
  if (rt->mode == "single") {
    rt->engine = std::make_shared<Engine>(ddl::runtime::make_single_process_collectives(), engine_config(0));
    return rt;
  }
  int rank = given_rank, size = given_size;
  if (rt->mode == "store")
    join_through_ddl_run(*rt, rank, size);
  else if (rt->mode == "pmix")
    join_through_pmix(*rt, rank, size);
  else
    join_through_program_store(*rt, rank, size, *program);
  auto config = engine_config(rank);
  if (config.report_stragglers) config.rank_hosts = hosts_of_ranks(*rt->store, rank, size);
  rt->engine = std::make_shared<Engine>(world_collectives(*rt, rank, size, config), config);
  return rt;
}

// Gloo writes to its peers with writev(), which cannot ask for MSG_NOSIGNAL: without this a peer
// that dies mid-collective would kill the survivors with SIGPIPE instead of giving them an error.
// A handler the program installed itself is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace
}  // namespace ddl::api

using namespace ddl::api;  // NOLINT(google-build-using-namespace): the C entry points below are this file's face of it

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
  std::pair<ddl_status, std::string> first_failure{DDL_SUCCESS, ""};
  auto finalize = [&](Engine& engine) {
    auto result = engine.finalize();
    if (first_failure.first == DDL_SUCCESS) first_failure = std::move(result);
  };
  {
    std::lock_guard lock(rt->sets_mutex);
    // Every set is told first, so that their waits for the other ranks (each bounded by its
    // timeout) run side by side rather than one after another.
    for (auto& [id, set] : rt->sets)
      if (set->engine) set->engine->request_finalize();
    for (auto& [id, set] : rt->sets)
      if (set->engine) finalize(*set->engine);
    for (auto& engine : rt->retiring) finalize(*engine);
  }
  finalize(*rt->engine);
  if (first_failure.first != DDL_SUCCESS) return fail(first_failure.first, "ddl_finalize: " + first_failure.second);
  return DDL_SUCCESS;
}

}  // extern "C"

namespace {
// The program's store, as libddl's rendezvous calls it: a failed call throws, naming the key.
ddl::runtime::ProgramStore program_store_of(const ddl_store& store) {
  ddl::runtime::ProgramStore program;
  program.set = [store](const std::string& key, const std::vector<char>& value) {
    if (store.set(store.context, key.c_str(), value.data(), value.size()) != 0)
      throw ddl::Error(fmt::format("the program's store could not set key '{}'", key));
  };
  program.get = [store](const std::string& key, std::chrono::milliseconds timeout) -> std::optional<std::vector<char>> {
    std::vector<char> value;
    auto deliver = [](void* sink, const void* data, size_t size) {
      const auto* bytes = static_cast<const char*>(data);
      static_cast<std::vector<char>*>(sink)->assign(bytes, bytes + size);
    };
    if (store.get(store.context, key.c_str(), static_cast<long long>(timeout.count()), deliver, &value) != 0) return std::nullopt;
    return value;
  };
  return program;
}
}  // namespace

extern "C" {

ddl_status ddl_init_with_store(int rank, int size, const ddl_store* store) {
  if (store == nullptr || store->set == nullptr || store->get == nullptr)
    return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_init_with_store: the store and both its functions must be given");
  if (size < 1 || rank < 0 || rank >= size)
    return fail(
        DDL_ERROR_INVALID_ARGUMENT,
        fmt::format("ddl_init_with_store: rank {} of a world of {} ranks: the rank must be at least 0 and below the size", rank, size));
  std::lock_guard lock(g_mutex);
  if (g_runtime) {
    if (g_runtime->engine->rank() == rank && g_runtime->engine->size() == size) return DDL_SUCCESS;
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("ddl_init_with_store: asked to join as rank {} of {}, but this process "
                                                        "already is rank {} of {} ({}): ddl_finalize first",
                                                        rank, size, g_runtime->engine->rank(), g_runtime->engine->size(), g_runtime->mode));
  }
  ignore_sigpipe_unless_handled();
  try {
    const ddl::runtime::ProgramStore program = program_store_of(*store);
    g_runtime = start_runtime(g_generation++, &program, rank, size);
    return DDL_SUCCESS;
  } catch (const std::exception& e) {
    return fail(DDL_ERROR_BOOTSTRAP, fmt::format("ddl_init_with_store failed: {}", e.what()));
  }
}

const char* ddl_world_source(void) {
  std::lock_guard lock(g_mutex);
  if (!g_runtime) return "";
  if (g_runtime->mode == "store") return "ddl run";
  return g_runtime->mode.c_str();
}

int ddl_is_initialized(void) { return current_runtime() != nullptr; }

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

const char* ddl_nccl_version(void) { return ddl::runtime::nccl_library().version.c_str(); }
const char* ddl_nccl_path(void) { return ddl::runtime::nccl_library().path.c_str(); }
const char* ddl_nccl_origin(void) { return ddl::runtime::nccl_library().origin.c_str(); }
const char* ddl_nccl_error(void) { return ddl::runtime::nccl_library().error.c_str(); }

int ddl_has_pmix(void) { return ddl::runtime::pmix_compiled_in() ? 1 : 0; }

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

}  // extern "C"
