// Who holds the others back: for every op the negotiation agreed, the ranks whose announcement
// came in the last round, and how much later than the first rank's (DDL_REPORT_STRAGGLERS). Rounds
// are the unit: ranks whose announcements came in one round arrived together. Each rank's lags are
// sampled (a reservoir of kLagsKept), so the memory stays bounded however long the run.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ddl::runtime {

// Thread-safe: the rounds tell it, and a report may be written at exit while a round runs.
class StragglerTally {
 public:
  explicit StragglerTally(int world_size);

  // One op agreed by every rank; `late` are the world ranks that announced it last, `lag` after the
  // first (zero, and `late` empty, when every rank announced it in one round).
  void op_agreed(const std::vector<int>& late, std::chrono::steady_clock::duration lag);

  // "stragglers over 1200 ops: rank 5 on nid001234 arrived last in 83% of ops, median 120 ms later;
  // ..." for the `most_named` ranks late most often; `hosts` names each rank's host (may be empty).
  std::string report(const std::vector<std::string>& hosts, size_t most_named = 3) const;

 private:
  mutable std::mutex mutex_;
  // Each rank's lags for its median: a uniform sample of this many of them (reservoir sampling).
  static constexpr size_t kLagsKept = 1024;
  uint32_t median_us(size_t rank) const;
  uint64_t ops_ = 0;
  uint64_t ops_with_lag_ = 0;
  uint64_t random_ = 0x9e3779b97f4a7c15;        // xorshift state for the sample
  std::vector<uint64_t> times_last_;            // by world rank
  std::vector<std::vector<uint32_t>> lags_us_;  // by world rank, the sample
};

}  // namespace ddl::runtime
