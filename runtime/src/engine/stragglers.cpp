#include "runtime/src/engine/stragglers.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

#include <fmt/format.h>

namespace ddl::runtime {

namespace {

std::string duration_text(uint32_t us) {
  if (us < 1000) return fmt::format("{} us", us);
  if (us < 10'000'000) return fmt::format("{:.0f} ms", us / 1000.0);
  return fmt::format("{:.1f} s", us / 1e6);
}

}  // namespace

StragglerTally::StragglerTally(int world_size)
    : times_last_(static_cast<size_t>(world_size), 0), lags_us_(static_cast<size_t>(world_size)) {}

void StragglerTally::op_agreed(const std::vector<int>& late, std::chrono::steady_clock::duration lag) {
  std::lock_guard lock(mutex_);
  ++ops_;
  if (late.empty() || lag <= std::chrono::steady_clock::duration::zero()) return;
  ++ops_with_lag_;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(lag).count();
  const auto kept = static_cast<uint32_t>(std::min<long long>(us, UINT32_MAX));
  for (int rank : late) {
    if (rank < 0 || static_cast<size_t>(rank) >= times_last_.size()) continue;
    const uint64_t seen = ++times_last_[static_cast<size_t>(rank)];
    std::vector<uint32_t>& sample = lags_us_[static_cast<size_t>(rank)];
    if (sample.size() < kLagsKept) {
      sample.push_back(kept);
      continue;
    }
    random_ ^= random_ << 13;
    random_ ^= random_ >> 7;
    random_ ^= random_ << 17;
    if (const uint64_t slot = random_ % seen; slot < kLagsKept) sample[slot] = kept;
  }
}

uint32_t StragglerTally::median_us(size_t rank) const {
  std::vector<uint32_t> lags = lags_us_[rank];
  if (lags.empty()) return 0;
  std::nth_element(lags.begin(), lags.begin() + static_cast<std::ptrdiff_t>(lags.size() / 2), lags.end());
  return lags[lags.size() / 2];
}

std::string StragglerTally::report(const std::vector<std::string>& hosts, size_t most_named) const {
  std::lock_guard lock(mutex_);
  if (ops_ == 0) return {};
  std::string text = fmt::format("stragglers over {} op(s): ", ops_);
  if (ops_with_lag_ == 0) return text + "every rank announced each op in the same round";
  // Late most often first; among as often late, by the longer median wait (worked out only for the
  // ranks late at least as often as the last one named).
  std::vector<uint64_t> counts = times_last_;
  const size_t cut = std::min(most_named, counts.size()) - 1;
  std::nth_element(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(cut), counts.end(), std::greater<>());
  const uint64_t least_named = std::max<uint64_t>(counts[cut], 1);
  std::vector<uint32_t> medians(times_last_.size(), 0);
  for (size_t r = 0; r < medians.size(); ++r)
    if (times_last_[r] >= least_named) medians[r] = median_us(r);
  std::vector<size_t> ranks(times_last_.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  std::stable_sort(ranks.begin(), ranks.end(), [&](size_t a, size_t b) {
    return times_last_[a] != times_last_[b] ? times_last_[a] > times_last_[b] : medians[a] > medians[b];
  });
  std::vector<std::string> named;
  for (size_t r : ranks) {
    if (named.size() >= most_named || times_last_[r] == 0) break;
    const std::string host = r < hosts.size() && !hosts[r].empty() ? " on " + hosts[r] : "";
    named.push_back(fmt::format("rank {}{} arrived last in {:.0f}% of ops, median {} later", r, host,
                                100.0 * static_cast<double>(times_last_[r]) / static_cast<double>(ops_), duration_text(medians[r])));
  }
  for (size_t i = 0; i < named.size(); ++i) text += (i ? "; " : "") + named[i];
  return text +
         fmt::format(" ({:.0f}% of ops waited for some rank)", 100.0 * static_cast<double>(ops_with_lag_) / static_cast<double>(ops_));
}

}  // namespace ddl::runtime
