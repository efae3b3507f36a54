// The C API's process sets: made by the whole world or by their members only, released, asked
// about, and the engine an op on one of them runs on.
#include <algorithm>
#include <cctype>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "ddl/ddl.h"
#include "rendezvous/gloo_store.hpp"
#include "runtime/src/api/api_state.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::api {
namespace {

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
  if (!collectives) collectives = ddl::runtime::make_gloo_collectives(set.rank, size, *store, rt.interface, config.timeout);
  return collectives;
}

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
    return last_error();
  std::vector<int> differing;
  for (size_t i = 0; i < sorted.size(); ++i)
    if (digests[i] != digest) differing.push_back(sorted[i]);
  if (differing.empty()) return "";
  return fmt::format("ranks {} asked for a different set of ranks than rank {}", fmt::join(differing, ","), engine.rank());
}

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

}  // namespace

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

}  // namespace ddl::api

using namespace ddl::api;  // NOLINT(google-build-using-namespace)

extern "C" {

ddl_status ddl_process_set_create(const int* ranks, int count, ddl_process_set* out) {
  return with_runtime([&](Runtime& rt) {
    const int world = rt.engine->size();
    std::vector<int> sorted;
    if (ranks != nullptr && count > 0) sorted.assign(ranks, ranks + count);
    std::sort(sorted.begin(), sorted.end());
    const std::string local_error = out == nullptr ? "NULL output" : invalid_set_ranks(sorted, world);
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
        config.timeline = rt.engine->shared_timeline();  // the world's, which its engine opens and closes
        config.timeline_rows = fmt::format("set{}/", id);
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
    // Under a millisecond would be 0 ms, which the store takes for "at once" and Gloo for "never".
    if (!(timeout_seconds == 0.0 || (timeout_seconds >= 0.001 && timeout_seconds <= 1e9)))
      error = fmt::format("timeout {} s is neither 0 (DDL_TIMEOUT) nor from 0.001 to 1e9", timeout_seconds);
    if (!error.empty()) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_process_set_create_among: " + error);
    auto set = std::make_shared<ProcessSet>();
    set->ranks = sorted;
    set->rank = static_cast<int>(me - sorted.begin());
    set->members_only = true;
    auto config = engine_config(rt.engine->rank());
    config.timeline = rt.engine->shared_timeline();  // the world's, which its engine opens and closes
    config.timeline_rows = fmt::format("{}/", key);
    config.world_ranks = sorted;
    if (timeout_seconds > 0.0) {
      config.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_seconds * 1000.0));
      config.timeout_setting = "the timeout this process set was made with";
    }
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
    if (set->engine)
      if (auto [status, message] = set->engine->finalize(); status != DDL_SUCCESS)
        return fail(status, "ddl_process_set_destroy: " + message);
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

}  // extern "C"
