#include "runtime/src/engine/negotiator.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace ddl::runtime {

namespace {
// "0,2-5,7" for a list of ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    i = j + 1;
  }
  return out;
}
}  // namespace

std::optional<uint32_t> Negotiator::cached_id(const std::string& name, const OpSpec& spec) const {
  auto it = cache_ids_.find(name);
  if (it == cache_ids_.end() || !(cache_[it->second].second == spec)) return std::nullopt;
  return it->second;
}

void Negotiator::remember(const std::string& name, const OpSpec& spec) {
  if (auto it = cache_ids_.find(name); it != cache_ids_.end()) {
    cache_[it->second].second = spec;  // same name, new spec (agreed by every rank): update in place
    return;
  }
  if (cache_.size() >= cache_capacity_) return;  // full: later names are announced in full
  cache_ids_.emplace(name, static_cast<uint32_t>(cache_.size()));
  cache_.emplace_back(name, spec);
}

RoundDecision Negotiator::merge(const std::vector<Announcement>& announcements, std::chrono::steady_clock::time_point now) {
  RoundDecision decision;
  decision.all_finalizing = true;
  std::vector<std::string> completed;
  for (int rank = 0; rank < size_; ++rank) {
    const Announcement& a = announcements[static_cast<size_t>(rank)];
    decision.all_finalizing = decision.all_finalizing && a.finalizing;
    std::vector<std::pair<std::string, OpSpec>> ops;
    for (uint32_t id : a.cached) {
      if (id >= cache_.size()) throw std::runtime_error(fmt::format("rank {} announced unknown cache id {}", rank, id));
      ops.push_back(cache_[id]);
    }
    ops.insert(ops.end(), a.submitted.begin(), a.submitted.end());
    for (const auto& [name, spec] : ops) {
      Entry& e = table_[name];
      if (e.specs.empty()) {
        e.specs.resize(static_cast<size_t>(size_));
        e.first_seen = now;
      }
      e.specs[static_cast<size_t>(rank)] = spec;
      if (rank == 0) e.order = next_order_++;
      if (++e.announced == size_) completed.push_back(name);
    }
  }
  // Rank 0's clock decides stalls, so that every rank fails the same ops in the same round.
  std::set<std::string> expired(announcements[0].expired.begin(), announcements[0].expired.end());
  for (const auto& name : expired) {
    auto it = table_.find(name);
    if (it == table_.end() || it->second.announced == size_) continue;
    decision.failed.push_back({name, DDL_ERROR_TIMEOUT, stall_message(name, it->second)});
    table_.erase(it);
  }
  std::sort(completed.begin(), completed.end(),
            [&](const std::string& a, const std::string& b) { return table_[a].order < table_[b].order; });
  for (const auto& name : completed) {
    Entry& e = table_[name];
    const OpSpec& first = *e.specs[0];
    bool same = std::all_of(e.specs.begin(), e.specs.end(), [&](const auto& s) { return *s == first; });
    if (same) {
      decision.ready.push_back({name, first});
      remember(name, first);
    } else {
      decision.failed.push_back({name, DDL_ERROR_MISMATCH, mismatch_message(name, e)});
    }
    table_.erase(name);
  }
  return decision;
}

std::string Negotiator::mismatch_message(const std::string& name, const Entry& e) const {
  // Group ranks by what they submitted: "rank 0-2: allreduce float32[4] sum; rank 3: ...".
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < size_; ++r) {
    std::string d = e.specs[static_cast<size_t>(r)]->describe();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == d; });
    if (it == groups.end()) groups.push_back({d, {r}});
    else it->second.push_back(r);
  }
  std::string parts;
  for (const auto& [d, ranks] : groups) parts += fmt::format("{}rank {}: {}", parts.empty() ? "" : "; ", rank_list(ranks), d);
  return fmt::format("op '{}' differs between ranks: {}", name, parts);
}

std::string Negotiator::stall_message(const std::string& name, const Entry& e) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r)
    if (!e.specs[static_cast<size_t>(r)]) missing.push_back(r);
  return fmt::format("op '{}' timed out: rank(s) {} never submitted it (raise DDL_TIMEOUT if they are only slow)", name,
                     rank_list(missing));
}

std::vector<std::string> Negotiator::stalled(std::chrono::steady_clock::time_point now, std::chrono::milliseconds timeout) const {
  std::vector<std::string> names;
  for (const auto& [name, e] : table_)
    if (e.announced < size_ && now - e.first_seen > timeout) names.push_back(name);
  return names;
}

std::vector<std::string> Negotiator::pending_names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : table_) names.push_back(name);
  return names;
}

}  // namespace ddl::runtime
