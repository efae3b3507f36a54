#include <doctest/doctest.h>

#include <algorithm>

#include "runtime/src/engine/negotiator.hpp"

using namespace ddl::runtime;
using Clock = std::chrono::steady_clock;

namespace {
OpSpec allreduce(uint64_t count) { return {OpKind::Allreduce, DDL_FLOAT32, DDL_SUM, 0, count, {}}; }
Announcement announce(std::vector<std::pair<std::string, OpSpec>> ops, bool finalizing = false) {
  Announcement a;
  a.submitted = std::move(ops);
  a.finalizing = finalizing;
  return a;
}
std::vector<std::string> names(const RoundDecision& d) {
  std::vector<std::string> out;
  for (const auto& r : d.ready) out.push_back(r.name());
  return out;
}
}  // namespace

TEST_CASE("an op is ready once every rank has submitted it, in rank 0's order") {
  Negotiator n(2);
  auto now = Clock::now();
  auto d1 = n.merge({announce({{"a", allreduce(4)}, {"b", allreduce(4)}}), announce({{"b", allreduce(4)}})}, now);
  CHECK(names(d1) == std::vector<std::string>{"b"});
  auto d2 = n.merge({announce({{"c", allreduce(1)}}), announce({{"c", allreduce(1)}, {"a", allreduce(4)}})}, now);
  CHECK(names(d2) == std::vector<std::string>{"a", "c"});  // rank 0 announced a before c
  CHECK(n.pending_names().empty());
}

TEST_CASE("different shapes on different ranks fail the op with the ranks and what differs") {
  Negotiator n(4);
  auto d = n.merge({announce({{"grad", allreduce(4)}}), announce({{"grad", allreduce(4)}}), announce({{"grad", allreduce(4)}}),
                    announce({{"grad", allreduce(5)}})},
                   Clock::now());
  CHECK(d.ready.empty());
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].status == DDL_ERROR_MISMATCH);
  CHECK(d.failed[0].message == "op 'grad' differs between ranks: rank 0-2: allreduce float32[4] sum; rank 3: allreduce float32[5] sum");
}

TEST_CASE("rank 0's list of stalled ops fails them everywhere, naming the missing ranks") {
  Negotiator n(3);
  auto t0 = Clock::now();
  n.merge({announce({{"x", allreduce(1)}}), announce({}), announce({{"x", allreduce(1)}})}, t0);
  CHECK(n.stalled(t0 + std::chrono::seconds(1), std::chrono::seconds(5)).empty());
  auto stalled = n.stalled(t0 + std::chrono::seconds(6), std::chrono::seconds(5));
  REQUIRE(stalled == std::vector<std::string>{"x"});
  Announcement rank0;
  rank0.expired = stalled;
  auto d = n.merge({rank0, announce({}), announce({})}, t0);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].status == DDL_ERROR_TIMEOUT);
  CHECK(d.failed[0].message.find("rank(s) 1 never submitted it") != std::string::npos);
}

TEST_CASE("all ranks finalizing ends negotiation") {
  Negotiator n(2);
  CHECK_FALSE(n.merge({announce({}, true), announce({})}, Clock::now()).all_finalizing);
  CHECK(n.merge({announce({}, true), announce({}, true)}, Clock::now()).all_finalizing);
}

TEST_CASE("announcements survive serialization") {
  Announcement a;
  a.finalizing = true;
  a.submitted = {{"grad/w", allreduce(1000)}, {"gv", {OpKind::Allgatherv, DDL_INT64, DDL_SUM, 0, 6, {1, 2, 3}}}};
  a.expired = {"old"};
  Announcement b = Announcement::parse(a.serialize());
  CHECK(b.finalizing);
  CHECK(b.submitted == a.submitted);
  CHECK(b.expired == a.expired);
  CHECK_THROWS(Announcement::parse("junk"));
}

TEST_CASE("the response cache: a repeated op is announced by id and still agreed") {
  Negotiator n(2);
  auto now = Clock::now();
  CHECK_FALSE(n.cached_id("g", allreduce(8)).has_value());
  n.merge({announce({{"g", allreduce(8)}}), announce({{"g", allreduce(8)}})}, now);
  auto id = n.cached_id("g", allreduce(8));
  REQUIRE(id.has_value());
  CHECK_FALSE(n.cached_id("g", allreduce(9)).has_value());  // another spec is announced in full
  Announcement by_id;
  by_id.cached = {*id};
  // Rank 0 uses the cache, rank 1 announces in full: the same op either way.
  auto d = n.merge({by_id, announce({{"g", allreduce(8)}})}, now);
  CHECK(names(d) == std::vector<std::string>{"g"});
  // A full announcement with a different spec on one rank is still a mismatch.
  auto m = n.merge({by_id, announce({{"g", allreduce(9)}})}, now);
  REQUIRE(m.failed.size() == 1);
  CHECK(m.failed[0].status == DDL_ERROR_MISMATCH);
}

TEST_CASE("a full cache stops growing but keeps working") {
  Negotiator n(1, 1);
  n.merge({announce({{"a", allreduce(1)}})}, Clock::now());
  n.merge({announce({{"b", allreduce(1)}})}, Clock::now());
  CHECK(n.cached_id("a", allreduce(1)).has_value());
  CHECK_FALSE(n.cached_id("b", allreduce(1)).has_value());
}

namespace {
Announcement by_ids(std::vector<uint32_t> ids) {
  Announcement a;
  a.cached = std::move(ids);
  return a;
}
// Makes "a", "b", "c" (allreduce of 1, 2, 3 elements) cached on a world of `size` and returns their ids.
std::vector<uint32_t> cache_abc(Negotiator& n, int size) {
  std::vector<Announcement> all(static_cast<size_t>(size), announce({{"a", allreduce(1)}, {"b", allreduce(2)}, {"c", allreduce(3)}}));
  n.merge(all, Clock::now());
  return {*n.cached_id("a", allreduce(1)), *n.cached_id("b", allreduce(2)), *n.cached_id("c", allreduce(3))};
}
}  // namespace

TEST_CASE("cached ops announced over several rounds in different orders run in rank 0's order") {
  Negotiator n(3);
  auto id = cache_abc(n, 3);
  auto now = Clock::now();
  auto d1 = n.merge({by_ids({id[2], id[0]}), by_ids({id[0]}), by_ids({id[1], id[0]})}, now);
  CHECK(names(d1) == std::vector<std::string>{"a"});
  CHECK(n.pending_names().size() == 2);
  auto d2 = n.merge({by_ids({id[1]}), by_ids({id[1], id[2]}), by_ids({id[2]})}, now);
  CHECK(names(d2) == std::vector<std::string>{"c", "b"});  // rank 0 announced c in the round before b
  CHECK(n.pending_names().empty());
}

TEST_CASE("ranks that announced by id and a rank that announces in full later are agreed on together") {
  Negotiator n(3);
  auto id = cache_abc(n, 3);
  auto now = Clock::now();
  CHECK(n.merge({by_ids({id[1]}), by_ids({id[1]}), announce({})}, now).ready.empty());
  auto same = n.merge({announce({}), announce({}), announce({{"b", allreduce(2)}})}, now);
  CHECK(names(same) == std::vector<std::string>{"b"});
  // The late rank's spec differs: the mismatch names both groups of ranks.
  n.merge({by_ids({id[1]}), by_ids({id[1]}), announce({})}, now);
  auto differs = n.merge({announce({}), announce({}), announce({{"b", allreduce(7)}})}, now);
  CHECK(differs.ready.empty());
  REQUIRE(differs.failed.size() == 1);
  CHECK(differs.failed[0].message == "op 'b' differs between ranks: rank 0-1: allreduce float32[2] sum; rank 2: allreduce float32[7] sum");
  // After a full announcement, a rank's later id announcement joins it.
  n.merge({announce({{"c", allreduce(3)}}), announce({}), announce({})}, now);
  CHECK(names(n.merge({announce({}), by_ids({id[2]}), by_ids({id[2]})}, now)) == std::vector<std::string>{"c"});
  CHECK(n.pending_names().empty());
}

TEST_CASE("a cached op some rank never announces stalls and fails everywhere") {
  Negotiator n(3);
  auto id = cache_abc(n, 3);
  auto t0 = Clock::now();
  n.merge({by_ids({id[0]}), announce({}), by_ids({id[0]})}, t0);
  CHECK(n.stalled(t0 + std::chrono::seconds(1), std::chrono::seconds(5)).empty());
  auto stalled = n.stalled(t0 + std::chrono::seconds(6), std::chrono::seconds(5));
  REQUIRE(stalled == std::vector<std::string>{"a"});
  Announcement rank0;
  rank0.expired = stalled;
  auto d = n.merge({rank0, announce({}), announce({})}, t0);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].status == DDL_ERROR_TIMEOUT);
  CHECK(d.failed[0].message.find("op 'a' timed out: rank(s) 1 never submitted it") != std::string::npos);
  CHECK(n.pending_names().empty());
  CHECK_FALSE(n.idle());  // rank 1 owes its late 'a': no op runs without a round until it came
  // The id is usable again afterwards. Rank 1's first 'a' is the one it was late with: it fails
  // there alone, where it would have paired with the others' next 'a' (another step's data).
  auto late = n.merge({by_ids({id[0]}), by_ids({id[0]}), by_ids({id[0]})}, t0);
  CHECK(late.ready.empty());
  REQUIRE(late.failed.size() == 1);
  CHECK((late.failed[0].name == "a" && late.failed[0].only_rank == 1 && late.failed[0].status == DDL_ERROR_TIMEOUT));
  CHECK(late.failed[0].message.find("the other ranks' op of this name timed out (the timeout of 0 s, DDL_TIMEOUT) before rank 1") !=
        std::string::npos);
  CHECK(names(n.merge({announce({}), by_ids({id[0]}), announce({})}, t0)) == std::vector<std::string>{"a"});
  CHECK(n.idle());
}

TEST_CASE("a rank late past the timeout with a named op: its late one fails there alone, each rank's next pairs with the others'") {
  // Steps 0 and 1 of "grad": rank 1 sleeps through step 0's timeout, then submits step 0's, then
  // step 1's. Its step 0 paired with the others' step 1, and every later step was a step apart.
  Negotiator n(3);
  n.say_timeout(std::chrono::seconds(10), "DDL_TIMEOUT");
  auto t0 = Clock::now();
  n.merge({announce({{"grad", allreduce(1)}}), announce({}), announce({{"grad", allreduce(1)}})}, t0);
  Announcement rank0;
  rank0.expired = n.stalled(t0 + std::chrono::seconds(11), std::chrono::seconds(10));
  REQUIRE(rank0.expired == std::vector<std::string>{"grad"});
  auto d0 = n.merge({rank0, announce({}), announce({})}, t0);
  REQUIRE(d0.failed.size() == 1);
  CHECK(d0.failed[0].only_rank == -1);  // on every rank that has it
  // Step 1 on ranks 0 and 2, step 0 at last on rank 1: no pair.
  auto d1 = n.merge({announce({{"grad", allreduce(1)}}), announce({{"grad", allreduce(1)}}), announce({{"grad", allreduce(1)}})}, t0);
  CHECK(d1.ready.empty());
  REQUIRE(d1.failed.size() == 1);
  CHECK((d1.failed[0].only_rank == 1 && d1.failed[0].message.starts_with("op 'grad' was not run: the other ranks' op of this name "
                                                                         "timed out (the timeout of 10 s, DDL_TIMEOUT)")));
  CHECK(n.pending_names() == std::vector<std::string>{"grad"});  // ranks 0 and 2's step 1
  auto d2 = n.merge({announce({}), announce({{"grad", allreduce(1)}}), announce({})}, t0);
  CHECK(names(d2) == std::vector<std::string>{"grad"});
  CHECK(d2.failed.empty());
  CHECK(n.idle());
  // A process set's late rank is named by its world rank.
  Negotiator set(2);
  set.name_ranks_by({4, 6});
  set.merge({announce({{"g", allreduce(1)}}), announce({})}, t0);
  Announcement first;
  first.expired = {"g"};
  set.merge({first, announce({})}, t0);
  auto late = set.merge({announce({}), announce({{"g", allreduce(1)}})}, t0);
  REQUIRE(late.failed.size() == 1);
  CHECK((late.failed[0].only_rank == 1 && late.failed[0].message.find("before world rank 6 submitted it") != std::string::npos));
}

TEST_CASE("a name agreed with a new spec keeps its cache id, which then stands for the new spec") {
  Negotiator n(2);
  auto id = cache_abc(n, 2);
  auto now = Clock::now();
  CHECK(names(n.merge({announce({{"a", allreduce(9)}}), announce({{"a", allreduce(9)}})}, now)) == std::vector<std::string>{"a"});
  CHECK_FALSE(n.cached_id("a", allreduce(1)).has_value());
  REQUIRE(n.cached_id("a", allreduce(9)) == id[0]);
  auto d = n.merge({by_ids({id[0]}), by_ids({id[0]})}, now);
  REQUIRE(d.ready.size() == 1);
  CHECK(d.ready[0].spec() == allreduce(9));
}

TEST_CASE("cached and fully announced ops that complete in one round keep rank 0's order") {
  Negotiator n(2);
  auto id = cache_abc(n, 2);
  auto t0 = Clock::now();
  // Rank 0 announces b (by id), then d (new), then a (by id) joined later by rank 1's full "a".
  n.merge({by_ids({id[1]}), announce({})}, t0);
  n.merge({announce({{"d", allreduce(4)}}), announce({})}, t0);
  n.merge({by_ids({id[0]}), announce({})}, t0);
  auto d = n.merge({announce({}), announce({{"a", allreduce(1)}, {"d", allreduce(4)}, {"b", allreduce(2)}})}, t0);
  CHECK(names(d) == std::vector<std::string>{"b", "d", "a"});
  CHECK(n.stalled(t0 + std::chrono::hours(1), std::chrono::seconds(1)).empty());  // nothing left to stall
}

TEST_CASE("an id wait that moved into a full entry still expires, naming the rank that is missing") {
  Negotiator n(3);
  auto id = cache_abc(n, 3);
  auto t0 = Clock::now();
  n.merge({by_ids({id[2]}), announce({}), announce({})}, t0);
  n.merge({announce({}), announce({{"c", allreduce(3)}}), announce({})}, t0 + std::chrono::seconds(2));
  // The wait began when rank 0 announced it, not when the entry was made.
  CHECK(n.stalled(t0 + std::chrono::seconds(6), std::chrono::seconds(5)) == std::vector<std::string>{"c"});
  Announcement rank0;
  rank0.expired = {"c"};
  auto d = n.merge({rank0, announce({}), announce({})}, t0);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].message.find("rank(s) 2 never submitted it") != std::string::npos);
  CHECK(n.pending_names().empty());
}

TEST_CASE("shapes, scales and the joined flag survive serialization") {
  Announcement a;
  OpSpec spec{OpKind::Reducescatter, DDL_INT16, DDL_MAX, 0, 6, {4, 2}, false, false, {6, 1}, 0.25, 3.0};
  a.submitted = {{"rs", spec}};
  a.joined = true;
  Announcement b = Announcement::parse(a.serialize());
  REQUIRE(b.submitted.size() == 1);
  CHECK(b.submitted[0].second == spec);
  CHECK(b.joined);
  CHECK_FALSE(b.finalizing);
}

TEST_CASE("the same element count in different shapes is a mismatch") {
  Negotiator n(2);
  OpSpec flat{OpKind::Allreduce, DDL_FLOAT32, DDL_SUM, 0, 6, {}, false, false, {2, 3}};
  OpSpec other = flat;
  other.shape = {3, 2};
  auto d = n.merge({announce({{"x", flat}}), announce({{"x", other}})}, Clock::now());
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].status == DDL_ERROR_MISMATCH);
  CHECK(d.failed[0].message.find("shape (2,3)") != std::string::npos);
}

TEST_CASE("while a rank waits in join, others' allreduces complete without it and broadcasts fail") {
  Negotiator n(3);
  auto now = Clock::now();
  OpSpec join{OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}};
  OpSpec bcast{OpKind::Broadcast, DDL_FLOAT32, DDL_SUM, 0, 4, {}};
  Announcement joined = announce({{"ddl.join", join}});
  joined.joined = true;
  // Rank 1 joins; ranks 0 and 2 allreduce "g": ready with rank 1 standing in.
  auto d1 = n.merge({announce({{"g", allreduce(4)}}), joined, announce({{"g", allreduce(4)}})}, now);
  REQUIRE(d1.ready.size() == 1);
  CHECK(d1.ready[0].name() == "g");
  CHECK(d1.ready[0].some_joined);
  Announcement still = announce({});
  still.joined = true;
  auto d2 = n.merge({announce({{"b", bcast}}), still, announce({{"b", bcast}})}, now);
  CHECK(d2.ready.empty());
  REQUIRE(d2.failed.size() == 1);
  CHECK(d2.failed[0].status == DDL_ERROR_UNSUPPORTED);
  // Ranks 2 then 0 join: the join completes, naming rank 0 (the last to join) on every rank.
  Announcement joined2 = joined;
  auto d3 = n.merge({announce({}), still, joined2}, now);
  CHECK(d3.ready.empty());
  auto d4 = n.merge({joined2, still, still}, now);
  REQUIRE(d4.ready.size() == 1);
  CHECK(d4.ready[0].spec().kind == OpKind::Join);
  CHECK(d4.ready[0].last_joined == 0);
}

TEST_CASE("a waiting join stalls only after DDL_TIMEOUT without any op running, other ops after DDL_TIMEOUT") {
  using std::chrono::seconds;
  Negotiator n(2);
  const auto t0 = Clock::now();
  OpSpec join{OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}};
  Announcement joined = announce({{"ddl.join", join}});
  joined.joined = true;
  n.merge({joined, announce({})}, t0);
  Announcement still = announce({});
  still.joined = true;
  // Rank 1 trains on: its allreduce at t0+4 s runs with rank 0 standing in.
  REQUIRE(n.merge({still, announce({{"g", allreduce(4)}})}, t0 + seconds(4)).ready.size() == 1);
  CHECK(n.stalled(t0 + seconds(8), seconds(5)).empty());  // 8 s after the join, 4 s after the last op
  REQUIRE(n.merge({still, announce({{"x", allreduce(4)}})}, t0 + seconds(8)).ready.size() == 1);
  CHECK(n.stalled(t0 + seconds(12), seconds(5)).empty());
  const auto late = n.stalled(t0 + seconds(14), seconds(5));  // the last op ran at 8 s
  CHECK(std::find(late.begin(), late.end(), "ddl.join") != late.end());
}

// A message naming one op twice, counted as a second rank, would (with rank 0's expired list naming
// the op too) make merge() look up an entry it had already erased, a crash on every rank
// (tests/fuzz/corpus/negotiation/crash_same_op_twice, of fuzz_negotiation). A rank never
// has one name pending twice, so such a message is corrupt: an error, never counted.
TEST_CASE("a message announcing one op twice is an error, not a second rank") {
  Negotiator n(2);
  auto now = Clock::now();
  CHECK_THROWS_WITH_AS(n.merge({announce({{"x", allreduce(1)}, {"x", allreduce(2)}}), announce({})}, now), "rank 0 announced op 'x' twice",
                       std::runtime_error);
}

TEST_CASE("a message announcing one cache id twice is an error, not a second rank") {
  Negotiator n(2);
  auto now = Clock::now();
  REQUIRE(names(n.merge({announce({{"g", allreduce(4)}}), announce({{"g", allreduce(4)}})}, now)) == std::vector<std::string>{"g"});
  const uint32_t id = *n.cached_id("g", allreduce(4));
  Announcement again;
  again.cached = {id, id};
  CHECK_THROWS_WITH_AS(n.merge({again, announce({})}, now), "rank 0 announced op 'g' twice", std::runtime_error);
}

TEST_CASE("a process set's negotiator names its members by world rank") {
  Negotiator n(2);
  n.name_ranks_by({3, 7});  // set ranks 0 and 1 are world ranks 3 and 7
  auto t0 = Clock::now();
  auto d = n.merge({announce({{"g", allreduce(4)}}), announce({{"g", allreduce(5)}})}, t0);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].message.find("world rank 3: allreduce") != std::string::npos);
  CHECK(d.failed[0].message.find("world rank 7: allreduce") != std::string::npos);
  n.merge({announce({{"h", allreduce(1)}}), announce({})}, t0);
  Announcement rank0;
  rank0.expired = n.stalled(t0 + std::chrono::seconds(6), std::chrono::seconds(5));
  auto stalled = n.merge({rank0, announce({})}, t0);
  REQUIRE(stalled.failed.size() == 1);
  CHECK(stalled.failed[0].message.find("world rank(s) 7 never submitted it") != std::string::npos);
}

namespace {
OpSpec ordered_allreduce(uint64_t count, uint32_t group_size = 0) {
  OpSpec s = allreduce(count);
  s.ordered = true;
  s.group_size = group_size;
  return s;
}
// A part of a named grouped call of `size` parts.
OpSpec grouped(uint32_t size) {
  OpSpec s = allreduce(1);
  s.group_size = size;
  return s;
}
bool failed_with(const RoundDecision& d, const std::string& name, const std::string& part) {
  return std::any_of(d.failed.begin(), d.failed.end(),
                     [&](const FailedOp& f) { return f.name == name && f.message.find(part) != std::string::npos; });
}
}  // namespace

TEST_CASE("the new spec fields survive serialization: group size, ordered, a local failure") {
  Announcement a;
  OpSpec s = ordered_allreduce(3, 2);
  s.failure = "gather: bad list";
  a.submitted = {{"unnamed.4", s}, {"plain", allreduce(1)}};
  Announcement b = Announcement::parse(a.serialize());
  REQUIRE(b.submitted.size() == 2);
  CHECK(b.submitted[0].second == s);
  CHECK(b.submitted[1].second == allreduce(1));
}

TEST_CASE("grouped calls of different sizes are a mismatch on every rank, and the order of unnamed ops breaks") {
  // Rank 0 groups one tensor, rank 1 two: unnamed.0 differs in its group's size; unnamed.1, which only
  // rank 1 submitted, fails at once instead of pairing with rank 0's next call; named ops go on.
  Negotiator n(2);
  auto now = Clock::now();
  auto d1 = n.merge({announce({{"unnamed.0", ordered_allreduce(1, 1)}}),
                     announce({{"unnamed.0", ordered_allreduce(1, 2)}, {"unnamed.1", ordered_allreduce(1, 2)}})},
                    now);
  CHECK(d1.ready.empty());
  CHECK(failed_with(d1, "unnamed.0",
                    "op 'unnamed.0' differs between ranks: rank 0: allreduce float32[1] sum (one of a group of 1); "
                    "rank 1: allreduce float32[1] sum (one of a group of 2)"));
  CHECK(failed_with(d1, "unnamed.1", "out of step since an earlier one failed"));
  REQUIRE(n.order_broken());
  CHECK(n.order_broken()->name == "unnamed.0");
  // Later: rank 0's next unnamed op and rank 1's fail as they come; a named op runs.
  auto d2 = n.merge({announce({{"unnamed.1", ordered_allreduce(1)}, {"named", allreduce(1)}}), announce({{"named", allreduce(1)}})}, now);
  CHECK(names(d2) == std::vector<std::string>{"named"});
  CHECK(failed_with(d2, "unnamed.1", "The first failure: op 'unnamed.0' differs"));
  CHECK(n.pending_names().empty());
}

TEST_CASE("a named grouped call of different sizes fails every part at once, the parts only some ranks have too") {
  // Rank 0 groups one tensor, rank 1 three: g.1 and g.2, which rank 0 never submits, waited for
  // DDL_TIMEOUT on rank 1, whose next op then came too late for rank 0's.
  Negotiator n(2);
  auto now = Clock::now();
  auto d1 = n.merge({announce({{"g.0", grouped(1)}}), announce({{"g.0", grouped(3)}, {"g.1", grouped(3)}})}, now);
  CHECK(failed_with(d1, "g.0", "op 'g.0' differs between ranks"));
  CHECK(failed_with(d1, "g.1", "op 'g.1' was not run: it is a part of a grouped call whose parts ranks disagree on: op 'g.0' differs"));
  CHECK_FALSE(n.order_broken());
  // The last part comes a round later: it fails as it comes; named ops go on.
  auto d2 = n.merge({announce({{"after", allreduce(1)}}), announce({{"g.2", grouped(3)}, {"after", allreduce(1)}})}, now);
  CHECK(names(d2) == std::vector<std::string>{"after"});
  CHECK(failed_with(d2, "g.2", "a part of a grouped call"));
  CHECK(n.pending_names().empty());
  CHECK(n.idle());
}

TEST_CASE("a part two ranks' larger groups have fails for each as it comes, in different rounds") {
  Negotiator n(3);
  auto now = Clock::now();
  auto d1 = n.merge(
      {announce({{"g.0", grouped(1)}}), announce({{"g.0", grouped(2)}, {"g.1", grouped(2)}}), announce({{"g.0", grouped(3)}})}, now);
  CHECK(failed_with(d1, "g.1", "a part of a grouped call"));
  auto d2 = n.merge({announce({}), announce({}), announce({{"g.1", grouped(3)}, {"g.2", grouped(3)}})}, now);
  CHECK(failed_with(d2, "g.1", "a part of a grouped call"));  // rank 2's, a round after rank 1's
  CHECK(failed_with(d2, "g.2", "a part of a grouped call"));
  CHECK(n.idle());
}

TEST_CASE("parts abandoned once per call: the name's next call runs, its parts split over rounds") {
  Negotiator n(2);
  auto now = Clock::now();
  n.merge({announce({{"g.0", grouped(2)}}), announce({{"g.0", grouped(3)}, {"g.1", grouped(3)}, {"g.2", grouped(3)}})}, now);
  auto d = n.merge({announce({{"g.1", grouped(2)}}), announce({})}, now);  // g.1 differs too: g.2 is not abandoned again
  CHECK(failed_with(d, "g.1", "differs between ranks"));
  CHECK(n.idle());
  // The next call agrees; its last part comes from each rank in a round of its own.
  n.merge({announce({{"g.0", grouped(3)}, {"g.1", grouped(3)}, {"g.2", grouped(3)}}), announce({{"g.0", grouped(3)}, {"g.1", grouped(3)}})},
          now);
  d = n.merge({announce({}), announce({{"g.2", grouped(3)}})}, now);
  CHECK(names(d) == std::vector<std::string>{"g.2"});
  CHECK(d.failed.empty());
}

TEST_CASE("a group size from a corrupt announcement costs nothing per part: only announced parts are kept") {
  // A peer's bytes may say a group of four billion parts (found by fuzz_negotiation: one entry per
  // part ran the process out of memory). The parts beyond the smallest group are a range.
  Negotiator n(2);
  auto now = Clock::now();
  auto d1 =
      n.merge({announce({{"g.0", grouped(1)}}), announce({{"g.0", grouped(UINT32_MAX)}, {"g.4000000000", grouped(UINT32_MAX)}})}, now);
  CHECK(failed_with(d1, "g.0", "op 'g.0' differs between ranks"));
  CHECK(failed_with(d1, "g.4000000000", "a part of a grouped call"));
  // Names that only look like parts are not: a leading zero, a part 0 again, a number past the range.
  auto d2 = n.merge({announce({{"g.07", allreduce(1)}, {"g.99999999999", allreduce(1)}}),
                     announce({{"g.07", allreduce(1)}, {"g.99999999999", allreduce(1)}, {"g.5", grouped(UINT32_MAX)}})},
                    now);
  CHECK(names(d2) == std::vector<std::string>{"g.07", "g.99999999999"});
  CHECK(failed_with(d2, "g.5", "a part of a grouped call"));
  CHECK(n.idle());
}

TEST_CASE("a timed-out ordered op breaks the order: the ordered ops waiting then fail, cached ones too") {
  Negotiator n(2);
  auto t0 = Clock::now();
  // "allreduce.1" is agreed once, so cached; then rank 1 announces it by id while rank 0 waits on "allreduce.2".
  n.merge({announce({{"allreduce.1", ordered_allreduce(1)}}), announce({{"allreduce.1", ordered_allreduce(1)}})}, t0);
  const auto id = n.cached_id("allreduce.1", ordered_allreduce(1));
  REQUIRE(id);
  Announcement rank1;
  rank1.cached = {*id};
  n.merge({announce({{"allreduce.2", ordered_allreduce(1)}}), announce({})}, t0);
  n.merge({announce({}), rank1}, t0 + std::chrono::seconds(4));  // not stalled yet when allreduce.2 is
  Announcement rank0;
  rank0.expired = n.stalled(t0 + std::chrono::seconds(6), std::chrono::seconds(5));
  auto d = n.merge({rank0, announce({})}, t0);
  CHECK(failed_with(d, "allreduce.2", "timed out"));
  CHECK(failed_with(d, "allreduce.1", "out of step"));
  CHECK(n.idle());
}

TEST_CASE("a rank's local failure fails the op on every rank with its reason and keeps the order") {
  Negotiator n(3);
  auto now = Clock::now();
  OpSpec failing = ordered_allreduce(0);
  failing.kind = OpKind::Barrier;
  failing.failure = "gather: the root takes one output per rank";
  auto d = n.merge({announce({{"gather.3", failing}}), announce({{"gather.3", ordered_allreduce(4)}}), announce({})}, now);
  CHECK(d.failed.empty());  // rank 2 has not reached it yet
  d = n.merge({announce({}), announce({}), announce({{"gather.3", ordered_allreduce(4)}})}, now);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].status == DDL_ERROR_INVALID_ARGUMENT);
  CHECK(d.failed[0].message == "op 'gather.3' failed on rank 0: gather: the root takes one output per rank");
  CHECK_FALSE(n.order_broken());
  d = n.merge({announce({{"allreduce.4", ordered_allreduce(1)}}), announce({{"allreduce.4", ordered_allreduce(1)}}),
               announce({{"allreduce.4", ordered_allreduce(1)}})},
              now);
  CHECK(names(d) == std::vector<std::string>{"allreduce.4"});
}

TEST_CASE("an allgather's mismatch says what ranks compared: the element type and the shape of one row") {
  Negotiator n(2);
  OpSpec a{OpKind::AllgatherAny, DDL_FLOAT32, DDL_SUM, 0, 0, {}, false, false, {2}};
  OpSpec b{OpKind::AllgatherAny, DDL_FLOAT32, DDL_SUM, 0, 0, {}, false, false, {}};
  auto d = n.merge({announce({{"g", a}}), announce({{"g", b}})}, Clock::now());
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].message ==
        "op 'g' differs between ranks: rank 0: allgather of float32 rows of shape (2); rank 1: allgather of float32 elements");
}

TEST_CASE("a straggler tally names the ranks whose announcement came in the op's last round, and how much later") {
  StragglerTally tally(4);
  Negotiator n(4);
  n.count_stragglers(&tally);
  const auto t0 = Clock::now();
  const auto ms = [](int n) { return std::chrono::milliseconds(n); };
  // Round 1: ranks 0 and 1; round 2 (40 ms on): rank 3; round 3 (100 ms on): rank 2, last.
  n.merge({announce({{"g", allreduce(1)}}), announce({{"g", allreduce(1)}}), announce({}), announce({})}, t0);
  n.merge({announce({}), announce({}), announce({}), announce({{"g", allreduce(1)}})}, t0 + ms(40));
  auto agreed = n.merge({announce({}), announce({}), announce({{"g", allreduce(1)}}), announce({})}, t0 + ms(100));
  REQUIRE(names(agreed) == std::vector<std::string>{"g"});
  // Now by cache id: ranks 1 and 3 come 20 ms after ranks 0 and 2.
  Announcement early, late;
  early.cached = {*n.cached_id("g", allreduce(1))};
  late.cached = early.cached;
  n.merge({early, announce({}), early, announce({})}, t0 + ms(200));
  agreed = n.merge({announce({}), late, announce({}), late}, t0 + ms(220));
  REQUIRE(names(agreed) == std::vector<std::string>{"g"});
  // Every rank in one round: agreed without anyone late.
  n.merge({early, early, early, early}, t0 + ms(300));

  // As often late, the longer wait first; then by rank.
  CHECK(tally.report({"n0", "n0", "n1", "n1"}, 2) ==
        "stragglers over 3 op(s): rank 2 on n1 arrived last in 33% of ops, median 100 ms later; rank 1 on n0 arrived last in 33% of "
        "ops, median 20 ms later (67% of ops waited for some rank)");
  CHECK(tally.report({}, 4).find("; rank 3 arrived last in 33% of ops, median 20 ms later (") != std::string::npos);
  CHECK(StragglerTally(2).report({}).empty());  // no op: nothing to say
}

TEST_CASE("a process set's tally names its members by world rank") {
  StragglerTally tally(8);
  Negotiator n(2);
  n.name_ranks_by({3, 6});
  n.count_stragglers(&tally);
  const auto t0 = Clock::now();
  n.merge({announce({{"g", allreduce(1)}}), announce({})}, t0);
  n.merge({announce({}), announce({{"g", allreduce(1)}})}, t0 + std::chrono::milliseconds(5));
  CHECK(tally.report({}) ==
        "stragglers over 1 op(s): rank 6 arrived last in 100% of ops, median 5 ms later (100% of ops waited for some rank)");
}

// Rank 0 waits in join; rank 1 was quiet for DDL_TIMEOUT and submits "g" in the very round that rank 0's
// clock fails the join. Every engine leaves join when its join fails, before it runs the round's ready
// ops: a "g" made ready with rank 0 standing in would find no stand-in there ("agreed but never
// submitted") and break the world. It waits for rank 0 instead.
TEST_CASE("a join that times out in the round another rank's op arrives stands in for nothing") {
  Negotiator n(2);
  const auto now = Clock::now();
  OpSpec join{OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}};
  Announcement joined = announce({{"ddl.join", join}});
  joined.joined = true;
  REQUIRE(n.merge({joined, announce({})}, now).ready.empty());
  Announcement still = announce({});
  still.joined = true;
  still.expired = {"ddl.join"};
  auto d = n.merge({still, announce({{"g", allreduce(4)}})}, now);
  REQUIRE(d.failed.size() == 1);
  CHECK(d.failed[0].name == "ddl.join");
  CHECK(d.failed[0].status == DDL_ERROR_TIMEOUT);
  CHECK(d.ready.empty());
  // Rank 0, out of join, submits "g": it runs with both ranks.
  auto d2 = n.merge({announce({{"g", allreduce(4)}}), announce({})}, now);
  REQUIRE(d2.ready.size() == 1);
  CHECK(d2.ready[0].name() == "g");
  CHECK_FALSE(d2.ready[0].some_joined);
}

TEST_CASE("a completed join ends what a late rank owes: its next op of that name pairs") {
  // The late rank never made the call (it skipped it): after a join, where every rank ran out of
  // work, none is owed.
  Negotiator n(2);
  const auto now = Clock::now();
  n.merge({announce({{"grad", allreduce(1)}}), announce({})}, now);
  Announcement expire = announce({});
  expire.expired = {"grad"};
  REQUIRE(n.merge({expire, announce({})}, now).failed.size() == 1);
  CHECK_FALSE(n.idle());
  OpSpec join{OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}};
  Announcement joined0 = announce({{"ddl.join", join}}), joined1 = announce({{"ddl.join", join}});
  joined0.joined = joined1.joined = true;
  CHECK(names(n.merge({joined0, joined1}, now)) == std::vector<std::string>{"ddl.join"});
  auto d = n.merge({announce({{"grad", allreduce(1)}}), announce({{"grad", allreduce(1)}})}, now);
  CHECK(names(d) == std::vector<std::string>{"grad"});
  CHECK(d.failed.empty());
  CHECK(n.idle());
}

TEST_CASE("while a rank waits in join, MIN, MAX and PRODUCT run unless prescaled") {
  Negotiator n(2);
  const auto now = Clock::now();
  OpSpec join{OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}};
  Announcement joined = announce({{"ddl.join", join}});
  joined.joined = true;
  n.merge({joined, announce({})}, now);
  Announcement still = announce({});
  still.joined = true;
  OpSpec max = allreduce(4);
  max.reduce = DDL_MAX;
  auto d = n.merge({still, announce({{"m", max}})}, now);
  REQUIRE(d.ready.size() == 1);
  CHECK(d.ready[0].some_joined);
  OpSpec scaled_product = allreduce(4);
  scaled_product.reduce = DDL_PRODUCT;
  scaled_product.prescale = 2.0;
  auto d2 = n.merge({still, announce({{"p", scaled_product}})}, now);
  CHECK(d2.ready.empty());
  REQUIRE(d2.failed.size() == 1);
  CHECK(d2.failed[0].status == DDL_ERROR_UNSUPPORTED);
  OpSpec scaled_sum = allreduce(4);
  scaled_sum.prescale = 2.0;
  REQUIRE(n.merge({still, announce({{"s", scaled_sum}})}, now).ready.size() == 1);
}
