// Agreement on which named ops every rank has submitted. Every rank feeds the same rounds of
// announcements (gathered from all ranks) into its own Negotiator, so every rank reaches the same
// decisions in the same order without a coordinator.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/src/core/op_spec.hpp"
#include "runtime/src/engine/announcement.hpp"
#include "runtime/src/engine/stragglers.hpp"

namespace ddl::runtime {

// An op every rank agreed on. Its name and spec are the negotiator's, not copies (a step of a
// thousand ops would otherwise copy a thousand names and shapes): valid until its next merge.
class ReadyOp {
 public:
  ReadyOp(const std::string& name, const OpSpec& spec, bool some_joined, int last_joined)
      : name_(&name), spec_(&spec), some_joined(some_joined), last_joined(last_joined) {}
  const std::string& name() const { return *name_; }
  const OpSpec& spec() const { return *spec_; }

 private:
  const std::string* name_;
  const OpSpec* spec_;

 public:
  bool some_joined = false;  // ranks in ddl_join stand in for this op
  int last_joined = -1;      // a join: the last rank to join
};

struct FailedOp {
  std::string name;
  ddl_status status = DDL_ERROR_INTERNAL;  // DDL_ERROR_MISMATCH, DDL_ERROR_TIMEOUT, or a rank's local error (OpSpec::failure)
  std::string message;
  int only_rank = -1;  // >= 0: fails on that rank alone (a late submission of an op that timed out)
};

// How ordered op `name` fails once the order broke with `first` (see Negotiator::order_broken).
FailedOp out_of_order_failure(const std::string& name, const FailedOp& first);

struct RoundDecision {
  std::vector<ReadyOp> ready;    // submitted by every rank with the same spec, in rank 0's order (valid until the next merge)
  std::vector<FailedOp> failed;  // to fail on every rank (or on its only_rank)
  bool all_finalizing = false;   // every rank has called finalize
};

// The response cache: every op that became ready gets the next id, on every rank alike (all ranks
// see the same ready ops in the same order). When the same name comes again with the same spec —
// every training step — a rank announces the 4-byte id instead of the name and spec.
class Negotiator {
 public:
  explicit Negotiator(int world_size, size_t cache_capacity = 4096) : size_(world_size), cache_capacity_(cache_capacity) {}
  // A process set's negotiator: its errors name its members by world rank.
  void name_ranks_by(std::vector<int> world_ranks) { world_ranks_ = std::move(world_ranks); }
  // The timeout an op that timed out names, and what sets it ("DDL_TIMEOUT").
  void say_timeout(std::chrono::milliseconds timeout, std::string setting) {
    timeout_ = timeout;
    timeout_setting_ = std::move(setting);
  }
  // Tells `tally` (which outlives this negotiator) of every op agreed: who announced it last, and
  // how much later. Without one, nothing is tracked.
  void count_stragglers(StragglerTally* tally) { stragglers_ = tally; }

  // The id under which this rank may announce (name, spec), if the cache holds exactly that.
  std::optional<uint32_t> cached_id(const std::string& name, const OpSpec& spec) const;

  // Merges one round: announcements[r] is what rank r announced. The decision's ready ops point
  // into this negotiator: they are valid until the next merge.
  RoundDecision merge(const std::vector<Announcement>& announcements, std::chrono::steady_clock::time_point now);

  // Ops some ranks submitted more than `timeout` ago that others have not (rank 0 announces these).
  std::vector<std::string> stalled(std::chrono::steady_clock::time_point now, std::chrono::milliseconds timeout) const;

  // Nothing is waiting for any rank, no rank is in ddl_join and none owes a late submission (see
  // late_submissions_). Every rank's Negotiator has merged the same rounds, so when one rank's is
  // idle, every rank's is.
  bool idle() const { return table_.empty() && cached_waiting_ == 0 && joined_count_ == 0 && late_submissions_.empty(); }
  // Every rank ran one op that every rank proposed in the same round (the engine's fast path), with
  // this negotiator idle: leaves the state a merge of that round would have left.
  void ran_without_round(std::chrono::steady_clock::time_point now);

  // Names still waiting for some rank, for messages at shutdown.
  std::vector<std::string> pending_names() const;

  // Ops numbered by their order (OpSpec::ordered) pair up only while every rank made the same
  // calls. Once one fails in a way that shows the ranks' counts apart (a timeout: some rank never
  // submitted that number; grouped calls of different sizes), later ones could pair with the wrong
  // calls of other ranks: from that round on, every ordered op of this process set fails at once on
  // every rank, naming the first failure, and the ones still waiting fail with it, until a join
  // renumbers them. A mismatch every rank submitted, or a rank's local error (OpSpec::failure),
  // leaves the counts in step. Named ops go on. This is the first failure, once there was one.
  const std::optional<FailedOp>& order_broken() const { return order_broken_; }
  // How ordered op `name` fails once the order is broken.
  FailedOp out_of_order(const std::string& name) const { return out_of_order_failure(name, *order_broken_); }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  // The ranks whose announcements of an op came in the latest round that brought any, and when.
  struct Arrivals {
    TimePoint when{};
    std::vector<int> ranks;
  };
  void note_arrival(Arrivals& last, int rank, TimePoint now) const;
  void tally_agreed(const Arrivals& last, TimePoint first_seen) const;
  // An op announced in full by some rank: what each rank announced.
  struct Entry {
    std::vector<std::optional<OpSpec>> specs;  // per rank
    int announced = 0;
    uint64_t order = UINT64_MAX;  // rank 0's announcement order
    TimePoint first_seen;
    Arrivals last;  // with a straggler tally
  };
  // An op every rank so far announced by cache id, so with the cached spec: the steady state of a
  // training loop, kept in a vector by id so that a step of a thousand ops costs no map lookups.
  struct CachedWait {
    int announced = 0;  // 0: nothing waiting under this id
    uint64_t order = UINT64_MAX;
    TimePoint first_seen;
    std::vector<bool> ranks;  // which ranks announced it
    Arrivals last;            // with a straggler tally
  };
  struct Completed {
    uint64_t order = 0;
    bool with_joined = false;           // some ranks never announced it: they joined
    const std::string* name = nullptr;  // announced in full by some rank (a key of table_), or
    std::optional<uint32_t> cached_id;  // by id by every rank (in cached_waits_; the name is cache_'s)
  };
  std::string mismatch_message(const std::string& name, const Entry& e) const;
  std::string stall_message(const std::string& name, const std::vector<int>& missing) const;
  std::vector<int> missing_ranks(const Entry& e) const;
  std::vector<int> missing_ranks(const CachedWait& w) const;

  void announce_cached(int rank, uint32_t id, TimePoint now, std::vector<Completed>& completed);
  void announce_full(int rank, const std::string& name, const OpSpec& spec, TimePoint now, std::vector<Completed>& completed);
  // The table's entry for `name`, made if new: its key is the name completed ops point to.
  std::unordered_map<std::string, Entry>::iterator entry_for(const std::string& name, TimePoint now);
  void remember(const std::string& name, const OpSpec& spec);

  // Fails `name` on every rank (decision.failed); an ordered op's failure breaks the order, a join's
  // ends every rank's wait in join.
  void fail(RoundDecision& decision, FailedOp failed, const OpSpec& spec);
  // The order broke in this merge: every ordered op still waiting fails with it.
  void fail_waiting_ordered(RoundDecision& decision);
  // `name` (NAME.k, a named grouped call's part) failed as a mismatch of group sizes: the parts
  // beyond the smallest group, which only some ranks submit, are to fail too (abandoned_parts_).
  void abandon_parts_beyond_smallest_group(const std::string& name, const Entry& e, const FailedOp& failed);
  void fail_abandoned_parts(RoundDecision& decision);
  std::string failure_message(const std::string& name, const Entry& e, std::optional<int>& failing_rank) const;

  void clear_wait(CachedWait& w);
  void update_joined(const std::vector<Announcement>& announcements);
  void complete_for_joined(std::vector<Completed>& completed) const;
  bool runs_with_joined(const OpSpec& spec) const;

  int size_;
  StragglerTally* stragglers_ = nullptr;
  std::vector<int> world_ranks_;          // set rank -> world rank, for messages; empty: the world's own
  std::chrono::milliseconds timeout_{0};  // for messages only: rank 0's engine decides what expired
  std::string timeout_setting_ = "DDL_TIMEOUT";
  // "rank 0,2", or a set's "world rank 3,5" (`word`: "rank" or "rank(s)")
  std::string ranks_named(const std::vector<int>& ranks, const char* word) const;
  std::vector<bool> joined_;  // ranks whose last announcement said they wait in ddl_join
  int joined_count_ = 0;
  int last_joined_ = -1;
  TimePoint last_progress_{};  // when an op last became ready (a waiting join stalls only without progress)
  size_t cache_capacity_;
  std::deque<std::pair<std::string, OpSpec>> cache_;  // by id; a deque, so that ready ops may point into it as it grows
  std::unordered_map<std::string, uint32_t> cache_ids_;
  std::vector<CachedWait> cached_waits_;  // by id
  size_t cached_waiting_ = 0;             // entries of cached_waits_ with announced > 0
  uint64_t next_order_ = 0;
  std::unordered_map<std::string, Entry> table_;
  // The parts NAME.k of a named grouped call whose ranks' group sizes differed, which only the ranks
  // with more parts submit: failed as they come (fail_abandoned_parts), with the mismatch's message,
  // rather than waited for until DDL_TIMEOUT. Kept as a range per call, keyed by "NAME.": a group
  // size comes from a peer's bytes, so nothing here grows with it, only with what ranks announce.
  struct AbandonedParts {
    unsigned first = 0;                               // parts first.. are abandoned
    std::vector<unsigned> group_sizes;                // per rank: the rank's parts are 0..size-1
    std::string mismatch;                             // why (the message of NAME.0's failure)
    std::map<unsigned, std::vector<bool>> announced;  // part -> the ranks that announced it since
    bool awaits(unsigned part) const;                 // some rank whose group has it has not announced it
    bool settled() const;                             // every rank announced every abandoned part of its group
  };
  // The abandoned range `name` falls in, and its part number; nullptr when it is in none.
  AbandonedParts* abandoned_range_of(const std::string& name, unsigned& part);
  std::map<std::string, AbandonedParts, std::less<>> abandoned_parts_;  // looked up by a name's prefix, not a copy of it
  // Named ops that timed out before some ranks submitted them: per name, how many such submissions
  // each rank has yet to make. A late rank's submission of that name fails on that rank alone
  // (settle_late_submission), where it would otherwise pair with the other ranks' next op of the name
  // (a later step's) and every rank would get another step's data without an error.
  std::unordered_map<std::string, std::vector<uint32_t>> late_submissions_;
  void expect_late_submissions(const std::string& name, const OpSpec& spec, const std::vector<int>& missing);
  bool settle_late_submission(int rank, const std::string& name, RoundDecision& decision);
  std::optional<FailedOp> order_broken_;
  std::deque<std::pair<std::string, OpSpec>> agreed_in_full_;  // the last merge's ready ops that were announced in full
};

}  // namespace ddl::runtime
