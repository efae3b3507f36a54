// Agreement on which named ops every rank has submitted. Every rank feeds the same rounds of
// announcements (gathered from all ranks) into its own Negotiator, so every rank reaches the same
// decisions in the same order without a coordinator.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/src/engine/op_spec.hpp"

namespace ddl::runtime {

struct ReadyOp {
  std::string name;
  OpSpec spec;
};

struct FailedOp {
  std::string name;
  ddl_status status;  // DDL_ERROR_MISMATCH or DDL_ERROR_TIMEOUT
  std::string message;
};

struct RoundDecision {
  std::vector<ReadyOp> ready;    // submitted by every rank with the same spec, in rank 0's order
  std::vector<FailedOp> failed;  // to fail on every rank
  bool all_finalizing = false;   // every rank has called finalize
};

// The response cache: every op that became ready gets the next id, on every rank alike (all ranks
// see the same ready ops in the same order). When the same name comes again with the same spec —
// every training step — a rank announces the 4-byte id instead of the name and spec.
class Negotiator {
 public:
  explicit Negotiator(int world_size, size_t cache_capacity = 4096) : size_(world_size), cache_capacity_(cache_capacity) {}

  // The id under which this rank may announce (name, spec), if the cache holds exactly that.
  std::optional<uint32_t> cached_id(const std::string& name, const OpSpec& spec) const;

  // Merges one round: announcements[r] is what rank r announced.
  RoundDecision merge(const std::vector<Announcement>& announcements, std::chrono::steady_clock::time_point now);

  // Ops some ranks submitted more than `timeout` ago that others have not (rank 0 announces these).
  std::vector<std::string> stalled(std::chrono::steady_clock::time_point now, std::chrono::milliseconds timeout) const;

  // Names still waiting for some rank, for messages at shutdown.
  std::vector<std::string> pending_names() const;

 private:
  struct Entry {
    std::vector<std::optional<OpSpec>> specs;  // per rank
    int announced = 0;
    uint64_t order = UINT64_MAX;  // rank 0's announcement order
    std::chrono::steady_clock::time_point first_seen;
  };
  std::string mismatch_message(const std::string& name, const Entry& e) const;
  std::string stall_message(const std::string& name, const Entry& e) const;

  void remember(const std::string& name, const OpSpec& spec);

  int size_;
  size_t cache_capacity_;
  std::vector<std::pair<std::string, OpSpec>> cache_;  // by id
  std::map<std::string, uint32_t> cache_ids_;
  uint64_t next_order_ = 0;
  std::map<std::string, Entry> table_;
};

}  // namespace ddl::runtime
