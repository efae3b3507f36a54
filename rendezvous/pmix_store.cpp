#include "rendezvous/pmix_store.hpp"

#include "common/error.hpp"

#if DDL_WITH_PMIX
#include <pmix.h>

#include <gloo/rendezvous/store.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rendezvous/gloo_store.hpp"
#endif

namespace ddl::runtime {

#if DDL_WITH_PMIX

struct PmixSession::State {
  pmix_proc_t me{};
  int size = 1;
  std::chrono::milliseconds timeout{};
};

namespace {

uint32_t get_u32(const pmix_proc_t& proc, const char* key, uint32_t fallback) {
  pmix_value_t* value = nullptr;
  if (PMIx_Get(&proc, key, nullptr, 0, &value) != PMIX_SUCCESS || value == nullptr) return fallback;
  uint32_t out = fallback;
  switch (value->type) {
    case PMIX_UINT32: out = value->data.uint32; break;
    case PMIX_UINT16: out = value->data.uint16; break;
    case PMIX_INT: out = static_cast<uint32_t>(value->data.integer); break;
    case PMIX_PROC_RANK: out = value->data.rank; break;
    default: break;
  }
  PMIX_VALUE_RELEASE(value);
  return out;
}

class PmixStore final : public gloo::rendezvous::Store {
 public:
  PmixStore(std::shared_ptr<PmixSession::State> state, bool fence_on_wait) : state_(std::move(state)), fence_on_wait_(fence_on_wait) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    pmix_value_t value;
    PMIX_VALUE_CONSTRUCT(&value);
    value.type = PMIX_BYTE_OBJECT;
    value.data.bo.bytes = const_cast<char*>(data.data());
    value.data.bo.size = data.size();
    std::string k = "ddl." + key;
    if (PMIx_Put(PMIX_GLOBAL, k.c_str(), &value) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
      throw Error(fmt::format("PMIx: cannot publish '{}'", key));
    dirty_ = true;
  }

  std::vector<char> get(const std::string& key) override {
    // Gloo names its keys after the rank that sets them ("3", "rank_3"): ask that rank's data,
    // blocking up to the timeout (the PMIx server fetches it if no fence has brought it yet).
    const int owner = trailing_rank(key);
    if (owner >= 0 && owner < state_->size) {
      if (auto value = lookup(owner, key, /*wait=*/true)) return *value;
    }
    for (int r = 0; r < state_->size; ++r)
      if (auto value = lookup(r, key, /*wait=*/false)) return *value;
    throw Error(fmt::format("PMIx: no rank published '{}'", key));
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, state_->timeout); }
  void wait(const std::vector<std::string>& /*keys*/, const std::chrono::milliseconds& timeout) override {
    if (!dirty_ || !fence_on_wait_) return;
    pmix_info_t info[2];
    bool collect = true;
    int seconds = static_cast<int>(std::max<long long>(1, timeout.count() / 1000));
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_proc_t all;
    PMIX_PROC_CONSTRUCT(&all);
    std::memcpy(all.nspace, state_->me.nspace, PMIX_MAX_NSLEN);
    all.rank = PMIX_RANK_WILDCARD;
    pmix_status_t rc = PMIx_Fence(&all, 1, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc != PMIX_SUCCESS) throw Error(fmt::format("PMIx fence failed: {}", PMIx_Error_string(rc)));
    dirty_ = false;
  }

 private:
  static int trailing_rank(const std::string& key) {
    size_t start = key.size();
    while (start > 0 && key[start - 1] >= '0' && key[start - 1] <= '9') --start;
    return start == key.size() ? -1 : std::atoi(key.c_str() + start);
  }

  std::optional<std::vector<char>> lookup(int rank, const std::string& key, bool wait) {
    pmix_proc_t proc;
    PMIX_PROC_CONSTRUCT(&proc);
    std::memcpy(proc.nspace, state_->me.nspace, PMIX_MAX_NSLEN);
    proc.rank = static_cast<pmix_rank_t>(rank);
    pmix_info_t info;
    bool optional = true;
    int seconds = static_cast<int>(std::max<long long>(1, state_->timeout.count() / 1000));
    if (wait)
      PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);
    else
      PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &optional, PMIX_BOOL);
    pmix_value_t* value = nullptr;
    const std::string k = "ddl." + key;
    pmix_status_t rc = PMIx_Get(&proc, k.c_str(), &info, 1, &value);
    PMIX_INFO_DESTRUCT(&info);
    std::optional<std::vector<char>> out;
    if (rc == PMIX_SUCCESS && value != nullptr && value->type == PMIX_BYTE_OBJECT)
      out.emplace(value->data.bo.bytes, value->data.bo.bytes + value->data.bo.size);
    if (value != nullptr) PMIX_VALUE_RELEASE(value);
    return out;
  }

  std::shared_ptr<PmixSession::State> state_;
  bool fence_on_wait_ = true;
  bool dirty_ = false;
};

}  // namespace

PmixSession::PmixSession(std::chrono::milliseconds timeout) : state_(std::make_shared<State>()) {
  state_->timeout = timeout;
  pmix_status_t rc = PMIx_Init(&state_->me, nullptr, 0);
  if (rc != PMIX_SUCCESS)
    throw Error(fmt::format("PMIx_Init failed: {}", PMIx_Error_string(rc)),
                "start the program with a PMIx launcher (mpirun, srun --mpi=pmix) or with `ddl run`");
  pmix_proc_t job;
  PMIX_PROC_CONSTRUCT(&job);
  std::memcpy(job.nspace, state_->me.nspace, PMIX_MAX_NSLEN);
  job.rank = PMIX_RANK_WILDCARD;
  world_.rank = static_cast<int>(state_->me.rank);
  world_.size = static_cast<int>(get_u32(job, PMIX_JOB_SIZE, 1));
  world_.local_rank = static_cast<int>(get_u32(state_->me, PMIX_LOCAL_RANK, 0));
  world_.local_size = static_cast<int>(get_u32(job, PMIX_LOCAL_SIZE, 1));
  world_.node_rank = static_cast<int>(get_u32(state_->me, PMIX_NODEID, 0));
  state_->size = world_.size;
}

PmixSession::~PmixSession() { PMIx_Finalize(nullptr, 0); }

std::unique_ptr<gloo::rendezvous::Store> PmixSession::gloo_store(const std::string& prefix, bool fence_on_wait) {
  // The ddl_init generation as a prefix, so keys of an earlier init are never read.
  return with_prefix(std::make_unique<PmixStore>(state_, fence_on_wait), prefix);
}

bool pmix_compiled_in() { return true; }

#else

struct PmixSession::State {};

PmixSession::PmixSession(std::chrono::milliseconds) {
  throw Error("this libddl was built without PMIx",
              "rebuild with libpmix-dev installed (DDL_WITH_PMIX), or start the program with `ddl run`");
}
PmixSession::~PmixSession() = default;
std::unique_ptr<gloo::rendezvous::Store> PmixSession::gloo_store(const std::string&, bool) { return nullptr; }
bool pmix_compiled_in() { return false; }

#endif

}  // namespace ddl::runtime
