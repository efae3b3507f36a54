#include "runtime/src/engine/negotiator.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "common/rank_ranges.hpp"

namespace ddl::runtime {

std::optional<uint32_t> Negotiator::cached_id(const std::string& name, const OpSpec& spec) const {
  auto it = cache_ids_.find(name);
  if (it == cache_ids_.end() || !(cache_[it->second].second == spec)) return std::nullopt;
  return it->second;
}

void Negotiator::clear_wait(CachedWait& w) {
  if (w.announced > 0) --cached_waiting_;
  w.announced = 0;
}

void Negotiator::remember(const std::string& name, const OpSpec& spec) {
  if (auto it = cache_ids_.find(name); it != cache_ids_.end()) {
    cache_[it->second].second = spec;  // same name, new spec (agreed by every rank): update in place
    return;
  }
  if (cache_.size() >= cache_capacity_) return;  // full: later names are announced in full
  cache_ids_.emplace(name, static_cast<uint32_t>(cache_.size()));
  cache_.emplace_back(name, spec);
  cached_waits_.emplace_back();
}

std::unordered_map<std::string, Negotiator::Entry>::iterator Negotiator::entry_for(const std::string& name, TimePoint now) {
  auto [it, inserted] = table_.try_emplace(name);
  Entry& e = it->second;
  if (!inserted) return it;
  e.specs.resize(static_cast<size_t>(size_));
  e.first_seen = now;
  // Ranks that announced this name by cache id before one announced it in full join the entry.
  if (auto id = cache_ids_.find(name); id != cache_ids_.end()) {
    CachedWait& w = cached_waits_[id->second];
    if (w.announced > 0) {
      for (int r = 0; r < size_; ++r)
        if (w.ranks[static_cast<size_t>(r)]) e.specs[static_cast<size_t>(r)] = cache_[id->second].second;
      e.announced = w.announced;
      e.order = w.order;
      e.first_seen = w.first_seen;
      e.last = w.last;
      clear_wait(w);
    }
  }
  return it;
}

void Negotiator::announce_full(int rank, const std::string& name, const OpSpec& spec, TimePoint now, std::vector<Completed>& completed) {
  const auto entry = entry_for(name, now);
  Entry& e = entry->second;
  // A rank never has one name pending twice (the engine refuses that at submit): a message that
  // does is corrupt, and counting it would complete the op without some rank, or twice.
  if (e.specs[static_cast<size_t>(rank)]) throw std::runtime_error(fmt::format("rank {} announced op '{}' twice", rank, name));
  e.specs[static_cast<size_t>(rank)] = spec;
  if (stragglers_) note_arrival(e.last, rank, now);
  if (rank == 0) e.order = next_order_++;
  if (++e.announced == size_) completed.push_back({e.order, false, &entry->first, std::nullopt});
}

void Negotiator::announce_cached(int rank, uint32_t id, TimePoint now, std::vector<Completed>& completed) {
  if (id >= cache_.size()) throw std::runtime_error(fmt::format("rank {} announced unknown cache id {}", rank, id));
  const auto& [name, spec] = cache_[id];
  if (table_.count(name)) {  // another rank announced it in full: agree on it there
    announce_full(rank, name, spec, now, completed);
    return;
  }
  CachedWait& w = cached_waits_[id];
  if (w.announced == 0) {
    w.ranks.assign(static_cast<size_t>(size_), false);
    w.first_seen = now;
    w.last = {};
    ++cached_waiting_;
  }
  if (w.ranks[static_cast<size_t>(rank)]) throw std::runtime_error(fmt::format("rank {} announced op '{}' twice", rank, name));
  w.ranks[static_cast<size_t>(rank)] = true;
  if (stragglers_) note_arrival(w.last, rank, now);
  if (rank == 0) w.order = next_order_++;
  if (++w.announced == size_) completed.push_back({w.order, false, &cache_[id].first, id});
}

// Ordered ops need none of this: a timeout breaks their order (order_broken_), and a join ends
// every rank's wait in join when it fails.
// Nor a rank in join (it stands in for no op it never submits; it submits none while it waits) or a
// part of an abandoned grouped call (which fails as it comes).
void Negotiator::expect_late_submissions(const std::string& name, const OpSpec& spec, const std::vector<int>& missing) {
  unsigned part = 0;
  if (spec.ordered || spec.kind == OpKind::Join || abandoned_range_of(name, part)) return;
  std::vector<uint32_t> owed(static_cast<size_t>(size_), 0);
  bool any = false;
  for (int r : missing)
    if (joined_.empty() || !joined_[static_cast<size_t>(r)]) {
      ++owed[static_cast<size_t>(r)];
      any = true;
    }
  if (!any) return;
  auto [it, inserted] = late_submissions_.try_emplace(name, std::move(owed));
  if (!inserted)
    for (size_t r = 0; r < it->second.size(); ++r) it->second[r] += owed[r];
}

bool Negotiator::settle_late_submission(int rank, const std::string& name, RoundDecision& decision) {
  auto it = late_submissions_.find(name);
  if (it == late_submissions_.end() || it->second[static_cast<size_t>(rank)] == 0) return false;
  --it->second[static_cast<size_t>(rank)];
  if (std::all_of(it->second.begin(), it->second.end(), [](uint32_t n) { return n == 0; })) late_submissions_.erase(it);
  decision.failed.push_back(
      {name, DDL_ERROR_TIMEOUT,
       fmt::format("op '{}' was not run: the other ranks' op of this name timed out (the timeout of {:g} s, {}) "
                   "before {} submitted it, so it has no peers; this rank's next op of this name pairs with "
                   "theirs",
                   name, static_cast<double>(timeout_.count()) / 1000.0, timeout_setting_, ranks_named({rank}, "rank")),
       rank});
  return true;
}

void Negotiator::note_arrival(Arrivals& last, int rank, TimePoint now) const {
  if (now > last.when) {
    last.when = now;
    last.ranks.clear();
  }
  last.ranks.push_back(world_ranks_.empty() ? rank : world_ranks_[static_cast<size_t>(rank)]);
}

void Negotiator::tally_agreed(const Arrivals& last, TimePoint first_seen) const {
  if (last.when > first_seen)
    stragglers_->op_agreed(last.ranks, last.when - first_seen);
  else
    stragglers_->op_agreed({}, {});
}

void Negotiator::update_joined(const std::vector<Announcement>& announcements) {
  joined_.resize(static_cast<size_t>(size_), false);
  joined_count_ = 0;
  for (int r = 0; r < size_; ++r) {
    const bool j = announcements[static_cast<size_t>(r)].joined;
    if (j && !joined_[static_cast<size_t>(r)]) last_joined_ = r;  // the highest rank joining in this round
    joined_[static_cast<size_t>(r)] = j;
    joined_count_ += j ? 1 : 0;
  }
}

// Ops that every rank not in ddl_join has announced are complete: the joined ranks stand in.
void Negotiator::complete_for_joined(std::vector<Completed>& completed) const {
  if (joined_count_ == 0) return;
  auto all_missing_joined = [&](auto has) {
    for (int r = 0; r < size_; ++r)
      if (!has(r) && !joined_[static_cast<size_t>(r)]) return false;
    return true;
  };
  for (const auto& entry : table_) {
    const Entry& e = entry.second;  // not a structured binding: clang before 16 cannot capture one (scripts/fuzz.sh uses clang 14)
    if (e.announced > 0 && e.announced < size_ && all_missing_joined([&](int r) { return e.specs[static_cast<size_t>(r)].has_value(); }))
      completed.push_back({e.order, true, &entry.first, std::nullopt});
  }
  for (size_t id = 0; cached_waiting_ > 0 && id < cached_waits_.size(); ++id) {
    const CachedWait& w = cached_waits_[id];
    if (w.announced > 0 && w.announced < size_ &&
        all_missing_joined([&](int r) { return static_cast<bool>(w.ranks[static_cast<size_t>(r)]); }))
      completed.push_back({w.order, true, &cache_[id].first, static_cast<uint32_t>(id)});
  }
}

// What a joined rank can stand in for: reductions (it adds zeros) and barriers. Broadcasts and
// gathers fail while a rank waits in join, as in Horovod.
bool Negotiator::runs_with_joined(const OpSpec& spec) const {
  if (spec.cuda) return false;
  if (spec.kind == OpKind::Barrier) return true;
  if (spec.kind != OpKind::Allreduce && spec.kind != OpKind::Reducescatter) return false;
  // A joined rank contributes the reduction's identity (Engine::stand_in_for). Scaled before the
  // reduction, only SUM's and AVERAGE's (zero) stays one: prescale times MIN's +inf or PRODUCT's 1 is not.
  return spec.prescale == 1.0 || spec.reduce == DDL_SUM || spec.reduce == DDL_AVERAGE;
}

RoundDecision Negotiator::merge(const std::vector<Announcement>& announcements, TimePoint now) {
  RoundDecision decision;
  decision.all_finalizing = true;
  agreed_in_full_.clear();  // the last decision's ready ops pointed here: they are done
  const bool broken_before = order_broken_.has_value();
  std::vector<Completed> completed;
  update_joined(announcements);
  for (int rank = 0; rank < size_; ++rank) {
    const Announcement& a = announcements[static_cast<size_t>(rank)];
    decision.all_finalizing = decision.all_finalizing && a.finalizing;
    for (uint32_t id : a.cached) {
      if (id < cache_.size() && settle_late_submission(rank, cache_[id].first, decision)) continue;
      if (order_broken_ && id < cache_.size() && cache_[id].second.ordered)
        decision.failed.push_back(out_of_order(cache_[id].first));
      else
        announce_cached(rank, id, now, completed);
    }
    for (const auto& [name, spec] : a.submitted) {
      if (settle_late_submission(rank, name, decision)) continue;
      if (order_broken_ && spec.ordered)
        decision.failed.push_back(out_of_order(name));
      else
        announce_full(rank, name, spec, now, completed);
    }
  }
  // Rank 0's clock decides stalls, so that every rank fails the same ops in the same round.
  std::set<std::string> expired(announcements[0].expired.begin(), announcements[0].expired.end());
  for (const auto& name : expired) {
    if (auto it = table_.find(name); it != table_.end()) {
      if (it->second.announced == size_) continue;
      const OpSpec spec = **std::find_if(it->second.specs.begin(), it->second.specs.end(), [](const auto& s) { return s.has_value(); });
      const std::vector<int> missing = missing_ranks(it->second);
      FailedOp failed{name, DDL_ERROR_TIMEOUT, stall_message(name, missing)};
      expect_late_submissions(name, spec, missing);
      table_.erase(it);
      fail(decision, std::move(failed), spec);
    } else if (auto id = cache_ids_.find(name); id != cache_ids_.end()) {
      CachedWait& w = cached_waits_[id->second];
      if (w.announced == 0 || w.announced == size_) continue;
      const std::vector<int> missing = missing_ranks(w);
      FailedOp failed{name, DDL_ERROR_TIMEOUT, stall_message(name, missing)};
      expect_late_submissions(name, cache_[id->second].second, missing);
      clear_wait(w);
      fail(decision, std::move(failed), cache_[id->second].second);
    }
  }
  complete_for_joined(completed);
  // Ops rank 0 never announced (it joined) come last, by name: the same order on every rank.
  std::sort(completed.begin(), completed.end(),
            [](const Completed& a, const Completed& b) { return a.order != b.order ? a.order < b.order : *a.name < *b.name; });
  // Every rank not in join submitted it (the joined ones never will): the order stays in step.
  auto joined_failure = [&](const std::string& name, const OpSpec& spec) {
    decision.failed.push_back(
        {name, DDL_ERROR_UNSUPPORTED,
         fmt::format("op '{}' ({}) cannot run while ranks wait in join: only host allreduce, reducescatter (MIN, MAX and "
                     "PRODUCT without a prescale) and barrier can",
                     name, spec.describe())});
  };
  for (const Completed& c : completed) {
    if (c.cached_id) {  // every rank announced the cached spec: agreed by construction
      if (stragglers_ && !c.with_joined) tally_agreed(cached_waits_[*c.cached_id].last, cached_waits_[*c.cached_id].first_seen);
      clear_wait(cached_waits_[*c.cached_id]);
      const OpSpec& spec = cache_[*c.cached_id].second;
      if (order_broken_ && spec.ordered)  // broken earlier in this round
        decision.failed.push_back(out_of_order(*c.name));
      else if (c.with_joined && !runs_with_joined(spec))
        joined_failure(*c.name, spec);
      else
        decision.ready.emplace_back(*c.name, spec, c.with_joined, spec.kind == OpKind::Join ? last_joined_ : -1);
      if (spec.kind == OpKind::Join) {  // as below
        order_broken_.reset();
        late_submissions_.clear();
      }
      continue;
    }
    auto it = table_.find(*c.name);
    Entry& e = it->second;
    const OpSpec& first = **std::find_if(e.specs.begin(), e.specs.end(), [](const auto& s) { return s.has_value(); });
    const bool any_ordered = std::any_of(e.specs.begin(), e.specs.end(), [](const auto& s) { return s && s->ordered; });
    std::optional<int> failing_rank;
    const std::string failure = failure_message(*c.name, e, failing_rank);
    bool same = std::all_of(e.specs.begin(), e.specs.end(), [&](const auto& s) { return !s || *s == first; });
    if (order_broken_ && any_ordered) {
      decision.failed.push_back(out_of_order(*c.name));
    } else if (failing_rank) {  // every rank reached this op, so the order is still in step
      decision.failed.push_back({*c.name, DDL_ERROR_INVALID_ARGUMENT, failure});
    } else if (same && c.with_joined && !runs_with_joined(first)) {
      joined_failure(*c.name, first);
    } else if (same) {
      if (stragglers_ && !c.with_joined) tally_agreed(e.last, e.first_seen);
      // A join ends with every rank numbering its unnamed ops afresh (Engine::run_single): in step
      // again; and every rank ran out of work in it, so none has a timed-out op still to submit.
      if (first.kind == OpKind::Join) {
        order_broken_.reset();
        late_submissions_.clear();
      }
      const auto& [name, spec] = agreed_in_full_.emplace_back(*c.name, first);  // the entry goes below
      decision.ready.emplace_back(name, spec, c.with_joined, spec.kind == OpKind::Join ? last_joined_ : -1);
      remember(name, spec);
    } else {
      // Every rank submitted this number, so a mismatch leaves the order in step (Horovod's own tests
      // go on after one); groups of different sizes do not (one rank has parts the others lack), nor
      // calls from different places (DDL_CHECK_CALL_SITES: some rank made a call the others did not).
      const bool counts_apart = std::any_of(e.specs.begin(), e.specs.end(), [&](const auto& s) {
        return s && (s->group_size != first.group_size || s->call_site != first.call_site);
      });
      OpSpec breaks = first;
      breaks.ordered = any_ordered && counts_apart;
      const FailedOp failed{*c.name, DDL_ERROR_MISMATCH, mismatch_message(*c.name, e)};
      if (!any_ordered) abandon_parts_beyond_smallest_group(*c.name, e, failed);
      fail(decision, failed, breaks);
    }
    table_.erase(it);  // c.name pointed to its key
  }
  fail_abandoned_parts(decision);
  if (order_broken_ && !broken_before) fail_waiting_ordered(decision);
  if (!decision.ready.empty()) last_progress_ = now;
  return decision;
}

void Negotiator::fail(RoundDecision& decision, FailedOp failed, const OpSpec& spec) {
  if (spec.ordered && !order_broken_) order_broken_ = failed;
  // A failed join ends the wait of every rank in it (each engine leaves join when its join fails,
  // before it runs the round's ready ops): from here on none stands in for an op.
  if (spec.kind == OpKind::Join) {
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
  }
  decision.failed.push_back(std::move(failed));
}

void Negotiator::abandon_parts_beyond_smallest_group(const std::string& name, const Entry& e, const FailedOp& failed) {
  unsigned smallest = UINT_MAX, largest = 0;
  for (const auto& s : e.specs)
    if (s) {
      smallest = std::min(smallest, s->group_size);
      largest = std::max(largest, s->group_size);
    }
  // Once per call, from its part 0, which every rank's group has (a later part's mismatch would
  // abandon again a part already settled, and fail that name's next call).
  const size_t dot = name.rfind('.');
  if (smallest == largest || largest == 0 || dot == std::string::npos || !name.ends_with(".0")) return;
  AbandonedParts& a = abandoned_parts_[name.substr(0, dot + 1)];  // "NAME.": the parts are NAME.0 ... NAME.(size - 1)
  a = AbandonedParts{};
  a.first = std::max(smallest, 1u);  // part 0 is `name`, failing now
  a.mismatch = failed.message;
  a.group_sizes.assign(static_cast<size_t>(size_), 0);
  for (int r = 0; r < size_; ++r)
    if (const auto& spec = e.specs[static_cast<size_t>(r)]) a.group_sizes[static_cast<size_t>(r)] = spec->group_size;
}

bool Negotiator::AbandonedParts::awaits(unsigned part) const {
  const auto seen = announced.find(part);
  for (size_t r = 0; r < group_sizes.size(); ++r)
    if (group_sizes[r] > part && (seen == announced.end() || !seen->second[r])) return true;
  return false;
}

bool Negotiator::AbandonedParts::settled() const {
  for (size_t r = 0; r < group_sizes.size(); ++r) {
    const uint64_t owed = group_sizes[r] > first ? group_sizes[r] - first : 0;
    uint64_t given = 0;
    for (const auto& [part, ranks] : announced) given += (part < group_sizes[r] && ranks[r]) ? 1 : 0;
    if (given < owed) return false;
  }
  return true;
}

Negotiator::AbandonedParts* Negotiator::abandoned_range_of(const std::string& name, unsigned& part) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  auto it = abandoned_parts_.find(std::string_view(name).substr(0, dot + 1));
  if (it == abandoned_parts_.end()) return nullptr;
  const char* digits = name.data() + dot + 1;
  const char* end = name.data() + name.size();
  if (digits == end || (end - digits > 1 && *digits == '0')) return nullptr;  // a part is NAME.k as std::to_string writes k
  auto [stop, error] = std::from_chars(digits, end, part);
  if (error != std::errc{} || stop != end) return nullptr;
  return part >= it->second.first && it->second.awaits(part) ? &it->second : nullptr;
}

// An abandoned part that ranks announced (in full, or by its cached id) fails now on every rank
// that has it; its range stays, to fail parts as they come, until every rank whose group has a part
// announced it.
void Negotiator::fail_abandoned_parts(RoundDecision& decision) {
  if (abandoned_parts_.empty()) return;
  // The waiting ops in an abandoned range and the ranks that announced each, by name: every rank
  // fails them in the same order.
  std::map<std::string, std::vector<bool>> parts;
  unsigned part = 0;
  for (const auto& [name, e] : table_)
    if (abandoned_range_of(name, part)) {
      auto& ranks = parts[name];
      for (const auto& spec : e.specs) ranks.push_back(spec.has_value());
    }
  for (size_t id = 0; cached_waiting_ > 0 && id < cached_waits_.size(); ++id)
    if (cached_waits_[id].announced > 0 && abandoned_range_of(cache_[id].first, part))
      parts.try_emplace(cache_[id].first, cached_waits_[id].ranks);

  for (const auto& [name, ranks] : parts) {
    AbandonedParts* range = abandoned_range_of(name, part);
    std::vector<bool>& seen = range->announced[part];
    seen.resize(static_cast<size_t>(size_), false);
    for (int r = 0; r < size_; ++r)
      if (ranks[static_cast<size_t>(r)]) seen[static_cast<size_t>(r)] = true;
    if (auto entry = table_.find(name); entry != table_.end())
      table_.erase(entry);
    else
      clear_wait(cached_waits_[cache_ids_.at(name)]);
    decision.failed.push_back(
        {name, DDL_ERROR_MISMATCH,
         fmt::format("op '{}' was not run: it is a part of a grouped call whose parts ranks disagree on: {}", name, range->mismatch)});
  }
  std::erase_if(abandoned_parts_, [](const auto& range) { return range.second.settled(); });
}

FailedOp out_of_order_failure(const std::string& name, const FailedOp& first) {
  return {name, first.status,
          fmt::format("op '{}' was not run: the ops of this process set that are numbered by their order (unnamed ops, a torch "
                      "group's ops) are out of step since an earlier one failed, so it could pair with another call of some rank; "
                      "make the process set again (or init again) to go on. The first failure: {}",
                      name, first.message)};
}

void Negotiator::fail_waiting_ordered(RoundDecision& decision) {
  for (auto it = table_.begin(); it != table_.end();) {
    const auto& specs = it->second.specs;
    if (std::any_of(specs.begin(), specs.end(), [](const auto& s) { return s && s->ordered; })) {
      decision.failed.push_back(out_of_order(it->first));
      it = table_.erase(it);
    } else {
      ++it;
    }
  }
  for (size_t id = 0; cached_waiting_ > 0 && id < cached_waits_.size(); ++id) {
    if (cached_waits_[id].announced == 0 || !cache_[id].second.ordered) continue;
    decision.failed.push_back(out_of_order(cache_[id].first));
    clear_wait(cached_waits_[id]);
  }
}

// A rank's local error (OpSpec::failure) of an op every rank announced: the message every rank
// fails it with, naming the lowest such rank, which `failing_rank` is set to; empty if none.
std::string Negotiator::failure_message(const std::string& name, const Entry& e, std::optional<int>& failing_rank) const {
  for (int r = 0; r < size_; ++r) {
    const auto& spec = e.specs[static_cast<size_t>(r)];
    if (!spec || spec->failure.empty()) continue;
    failing_rank = r;
    return fmt::format("op '{}' failed on {}: {}", name, ranks_named({r}, "rank"), spec->failure);
  }
  return {};
}

void Negotiator::ran_without_round(TimePoint now) {
  if (stragglers_) stragglers_->op_agreed({}, {});  // every rank proposed it in one round
  last_progress_ = now;
  ++next_order_;
}

std::string Negotiator::mismatch_message(const std::string& name, const Entry& e) const {
  // Group ranks by what they submitted: "rank 0-2: allreduce float32[4] sum; rank 3: ...".
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < size_; ++r) {
    if (!e.specs[static_cast<size_t>(r)]) continue;  // a joined rank
    std::string d = e.specs[static_cast<size_t>(r)]->describe();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == d; });
    if (it == groups.end())
      groups.push_back({d, {r}});
    else
      it->second.push_back(r);
  }
  std::string parts;
  for (const auto& [d, ranks] : groups) parts += fmt::format("{}{}: {}", parts.empty() ? "" : "; ", ranks_named(ranks, "rank"), d);
  return fmt::format("op '{}' differs between ranks: {}", name, parts);
}

std::vector<int> Negotiator::missing_ranks(const Entry& e) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r)
    if (!e.specs[static_cast<size_t>(r)]) missing.push_back(r);
  return missing;
}

std::vector<int> Negotiator::missing_ranks(const CachedWait& w) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r)
    if (!w.ranks[static_cast<size_t>(r)]) missing.push_back(r);
  return missing;
}

std::string Negotiator::stall_message(const std::string& name, const std::vector<int>& missing) const {
  return fmt::format("op '{}' timed out: {} never submitted it within the timeout of {:g} s (raise {} if they are only slow)", name,
                     ranks_named(missing, "rank(s)"), static_cast<double>(timeout_.count()) / 1000.0, timeout_setting_);
}

std::string Negotiator::ranks_named(const std::vector<int>& ranks, const char* word) const {
  if (world_ranks_.empty()) return fmt::format("{} {}", word, rank_ranges(ranks));
  std::vector<int> world;
  world.reserve(ranks.size());
  for (int r : ranks) world.push_back(r >= 0 && static_cast<size_t>(r) < world_ranks_.size() ? world_ranks_[static_cast<size_t>(r)] : r);
  return fmt::format("world {} {}", word, rank_ranges(world));
}

// A join waits for ranks that still train, which may take longer than DDL_TIMEOUT: it stalls only
// when no op at all has run for that long. Every other op stalls DDL_TIMEOUT after it was first seen.
std::vector<std::string> Negotiator::stalled(TimePoint now, std::chrono::milliseconds timeout) const {
  auto waited = [&](TimePoint first_seen, const OpSpec& spec) {
    return now - (spec.kind == OpKind::Join ? std::max(first_seen, last_progress_) : first_seen);
  };
  std::vector<std::string> names;
  for (const auto& [name, e] : table_) {
    const OpSpec& spec = **std::find_if(e.specs.begin(), e.specs.end(), [](const auto& s) { return s.has_value(); });
    if (e.announced < size_ && waited(e.first_seen, spec) > timeout) names.push_back(name);
  }
  for (size_t id = 0; cached_waiting_ > 0 && id < cached_waits_.size(); ++id) {
    const CachedWait& w = cached_waits_[id];
    if (w.announced > 0 && w.announced < size_ && waited(w.first_seen, cache_[id].second) > timeout) names.push_back(cache_[id].first);
  }
  return names;
}

std::vector<std::string> Negotiator::pending_names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : table_) names.push_back(name);
  for (size_t id = 0; id < cached_waits_.size(); ++id)
    if (cached_waits_[id].announced > 0) names.push_back(cache_[id].first);
  return names;
}

}  // namespace ddl::runtime
