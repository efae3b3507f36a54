// The engine in one process: N threads, each a rank with its own Engine over a real transport
// (Gloo's TCP device on loopback, or the shared-memory segment), wired up through one in-process
// Gloo HashStore, the way Gloo tests its own algorithms. Run alone with `-ts=engine_threads`.
//
// What the engine does is observed where it meets its transport: every rank's transport is wrapped
// in a Probe that records what went over it (each allreduce's length and element width, this rank's
// negotiation announcements) and, for the tests, can park the engine thread at the start of a round
// (so ops submitted meanwhile are all announced in the next round, together: no race decides what
// fuses) or tear the transport down from inside the engine thread (a rank whose transport breaks).
// Nothing in the engine changes for the tests: the Probe is a Collectives like any other.
#include <doctest/doctest.h>

#include <gloo/rendezvous/hash_store.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "runtime/src/engine/engine.hpp"
#include "runtime/src/transports/collectives.hpp"

using namespace ddl::runtime;
using namespace std::chrono_literals;

namespace {

enum class Transport { Gloo, SharedMemory };
const Transport kTransports[] = {Transport::Gloo, Transport::SharedMemory};
const int kSizes[] = {2, 4};

const char* transport_name(Transport t) { return t == Transport::Gloo ? "gloo" : "shared memory"; }

// One allreduce as the transport saw it.
struct WireAllreduce {
  size_t count;
  size_t element_size;
  bool operator==(const WireAllreduce&) const = default;
};

// "[1024x4B, 18x4B]", for messages.
std::string show(const std::vector<WireAllreduce>& calls) {
  std::string out;
  for (const auto& c : calls) out += fmt::format("{}{}x{}B", out.empty() ? "" : ", ", c.count, c.element_size);
  return "[" + out + "]";
}

// Checks what went over the wire, showing it when it is not what was expected.
#define CHECK_WIRE(actual, ...)                                                                                                 \
  do {                                                                                                                          \
    const std::vector<WireAllreduce> wire_seen = (actual);                                                                      \
    const std::vector<WireAllreduce> wire_expected = __VA_ARGS__;                                                               \
    CHECK_MESSAGE(wire_seen == wire_expected, "allreduces on the wire: ", show(wire_seen), ", expected ", show(wire_expected)); \
  } while (false)

class Probe final : public Collectives {
 public:
  explicit Probe(std::unique_ptr<Collectives> inner)
      : inner_(std::move(inner)), rank_(inner_->rank()), size_(inner_->size()), reduces_pieces_(inner_->reduces_pieces()) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> allgather_bytes(const std::string& mine) override {
    gate();
    auto all = live().allgather_bytes(mine);
    record(mine, false);
    return all;
  }
  // Passed on, so that a transport that runs an agreed op in the round itself (shared memory) does.
  ProposalOutcome allgather_bytes_proposing(const std::function<std::string()>& mine, const ProposedOp& op,
                                            std::vector<std::string>& round) override {
    gate();
    const ProposalOutcome outcome = live().allgather_bytes_proposing(mine, op, round);
    record(mine(), outcome == ProposalOutcome::Ran);
    return outcome;
  }
  void allreduce(void* data, size_t bytes, size_t element_size, ReduceFunction reduce) override {
    {
      std::lock_guard lock(mutex_);
      allreduces_.push_back({bytes / element_size, element_size});
    }
    live().allreduce(data, bytes, element_size, reduce);
  }
  // Passed on, so that a transport that reduces a fused allreduce without a fusion buffer (shared
  // memory) does; recorded as one allreduce of the pieces' elements.
  bool reduces_pieces() const override { return reduces_pieces_; }
  void allreduce_pieces(std::span<const ReducePiece> pieces, size_t element_size, ReduceFunction reduce) override {
    size_t bytes = 0;
    for (const ReducePiece& piece : pieces) bytes += piece.bytes;
    {
      std::lock_guard lock(mutex_);
      allreduces_.push_back({bytes / element_size, element_size});
    }
    live().allreduce_pieces(pieces, element_size, reduce);
  }
  void broadcast(void* data, size_t bytes, int root) override { live().broadcast(data, bytes, root); }
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) override {
    live().allgatherv(send, recv, bytes_per_rank);
  }
  void alltoall(const void* send, void* recv, size_t bytes_per_rank) override { live().alltoall(send, recv, bytes_per_rank); }
  void barrier() override { live().barrier(); }

  // Parks the engine thread at the start of its next negotiation round, once it has built that
  // round's announcement; returns false if it never got there. Ops submitted until resume() are
  // all in the announcement after it.
  bool pause() {
    hold();
    return wait_parked();
  }
  // pause() in two halves: whichever round runs next (the engine thread's, or a caller's proposal)
  // parks once it has built its announcement, and wait_parked() says when one has.
  void hold() {
    std::lock_guard lock(mutex_);
    hold_ = true;
  }
  bool wait_parked() {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, 20s, [&] { return parked_; });
  }
  void resume() {
    std::lock_guard lock(mutex_);
    hold_ = false;
    cv_.notify_all();
  }
  // The engine thread's next call tears the transport down (a Gloo rank closes its connections; a
  // shared-memory rank unmaps the segment and never arrives at a barrier again) and throws, as a
  // transport whose peer vanished does.
  void sever() { sever_ = true; }

  // What went over the transport since the last take: allreduces, and this rank's non-empty
  // announcements.
  std::vector<WireAllreduce> take_allreduces() {
    std::lock_guard lock(mutex_);
    return std::exchange(allreduces_, {});
  }
  std::vector<Announcement> take_announcements() {
    std::lock_guard lock(mutex_);
    return std::exchange(announcements_, {});
  }
  // How many of this rank's proposals the transport ran in their own round, since the last take.
  int take_ran_in_round() {
    std::lock_guard lock(mutex_);
    return std::exchange(ran_in_round_, 0);
  }

 private:
  void gate() {
    std::unique_lock lock(mutex_);
    if (!hold_) return;
    parked_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
    parked_ = false;
  }
  void record(const std::string& mine, bool ran_in_round) {
    Announcement a;
    try {
      a = Announcement::parse(mine);
    } catch (const std::exception&) {
      // Not a round's announcement: the CUDA route's exchanges (agree_on_gpu_route's verdicts, the
      // staged copies' outcome), marked by their first letter. Anything else is the engine's bug.
      if (!mine.empty() && std::string_view("NHEC").find(mine[0]) != std::string_view::npos) return;
      throw;
    }
    std::lock_guard lock(mutex_);
    ran_in_round_ += ran_in_round ? 1 : 0;
    if (!a.submitted.empty() || !a.cached.empty()) announcements_.push_back(std::move(a));
  }
  Collectives& live() {
    if (sever_) {
      inner_.reset();
      throw ddl::PeerLostError("transport torn down by the test");
    }
    return *inner_;
  }

  std::unique_ptr<Collectives> inner_;  // engine thread only (and the constructor)
  const int rank_, size_;
  const bool reduces_pieces_;
  std::atomic<bool> sever_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool hold_ = false, parked_ = false;
  std::vector<WireAllreduce> allreduces_;
  std::vector<Announcement> announcements_;
  int ran_in_round_ = 0;
};

// Ops submitted while the engine thread is parked: they go into one announcement.
class Paused {
 public:
  explicit Paused(Probe& probe) : probe_(probe) {
    if (!probe_.pause()) throw std::runtime_error("the engine thread never reached its next round");
  }
  ~Paused() { probe_.resume(); }
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  Probe& probe_;
};

struct RankContext {
  int rank;
  int size;
  Transport transport;
  Probe& probe;
  std::unique_ptr<Engine> engine;  // the fixture destroys it after the body, unless the body did
  std::function<void()> sync;      // returns once every rank's thread has called it (test-side only)
};

struct WorldOptions {
  std::function<EngineConfig(int rank)> config = [](int) { return EngineConfig{}; };
  std::chrono::milliseconds transport_timeout{10'000};  // what the transport waits for a peer
};

// Gloo's HashStore, with the blocking get() that ddl's stores have (the TCP store's get waits for
// the key, PMIx fetches it from its owner) and the shared-memory setup relies on; HashStore's own
// get() returns an empty value for a key not yet set. Gloo's own rendezvous waits before it gets.
class BlockingHashStore final : public gloo::rendezvous::HashStore {
 public:
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return HashStore::get(key);
  }
};

std::string describe(Transport t, int size) { return fmt::format("{} ranks over {}", size, transport_name(t)); }

// Runs `body` on `size` threads, each a rank with its own engine over `transport`, and reports
// anything a rank threw. A world that is not done within a minute (an engine that never lets go)
// aborts the test program rather than hanging it.
void run_world(Transport transport, int size, const WorldOptions& options, const std::function<void(RankContext&)>& body) {
  BlockingHashStore store;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::vector<std::string> errors;
  std::barrier<> threads_meet(size);
  const std::string world = describe(transport, size);
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!finished.wait_for(lock, 60s, [&] { return done; })) {
      std::fprintf(stderr, "engine_threads: %s did not finish within 60 s\n", world.c_str());
      std::abort();
    }
  });
  std::vector<std::thread> ranks;
  ranks.reserve(size);
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      const std::string where = fmt::format("rank {} of {}", r, world);
      INFO(where);  // doctest's context is per thread: every check below names its rank and world
      try {
        std::unique_ptr<Collectives> collectives = transport == Transport::Gloo
                                                       ? make_gloo_collectives(r, size, store, "127.0.0.1", options.transport_timeout)
                                                       : make_shared_memory_collectives(r, size, store, options.transport_timeout);
        if (!collectives) throw std::runtime_error("the shared-memory segment could not be set up");
        auto probe = std::make_unique<Probe>(std::move(collectives));
        Probe& p = *probe;
        RankContext ctx{
            r, size, transport, p, std::make_unique<Engine>(std::move(probe), options.config(r)), [&] { threads_meet.arrive_and_wait(); }};
        body(ctx);
        ctx.engine.reset();
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        errors.push_back(fmt::format("{}: {}", where, e.what()));
      }
    });
  }
  for (auto& t : ranks) t.join();
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  finished.notify_all();
  watchdog.join();
  for (const auto& e : errors) FAIL_CHECK(e);
}

void for_each_world(const WorldOptions& options, const std::function<void(RankContext&)>& body) {
  for (Transport t : kTransports)
    for (int size : kSizes) run_world(t, size, options, body);
}

struct Outcome {
  ddl_status status = DDL_SUCCESS;
  std::string message;
};

// An op's outcome; throws if it is not done within 20 s (an engine that hangs fails the test).
Outcome outcome(const std::shared_ptr<OpState>& op) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!op->done()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("an op was still not done after 20 s");
    std::this_thread::sleep_for(1ms);
  }
  Outcome o;
  o.status = op->wait(o.message);
  return o;
}

// Waits for `op` and checks it succeeded.
void succeeded(const std::shared_ptr<OpState>& op, const std::string& what) {
  Outcome o = outcome(op);
  CHECK_MESSAGE(o.status == DDL_SUCCESS, what, ": ", o.message);
}

OpSpec allreduce_spec(ddl_dtype dtype, uint64_t count) {
  OpSpec s;
  s.kind = OpKind::Allreduce;
  s.dtype = dtype;
  s.reduce = DDL_SUM;
  s.count = count;
  return s;
}

std::string temp_path(const char* what) {
  static std::atomic<int> counter{0};
  return (std::filesystem::temp_directory_path() / fmt::format("ddl-engine-threads-{}-{}-{}.json", ::getpid(), what, counter++)).string();
}

// A value only the rank, op and element make, and its sum over `size` ranks: small integers, so
// float sums are exact.
float input(int rank, int op, size_t j) { return static_cast<float>((rank + 1) * (op + 1)) + static_cast<float>(j); }
float expected_sum(int size, int op, size_t j) {
  return static_cast<float>((op + 1) * size * (size + 1) / 2) + static_cast<float>(size) * static_cast<float>(j);
}

// NCCL as the engine sees it, played on host memory over the rank's own transport: NCCL's ops of
// a group run at group_end() (as NCCL puts them on their streams only then), everything else at
// once, in call order (one stream's order). A copy enqueued inside a group thus runs before the
// group's reductions, as on a GPU, and a test sees the wrong result. It counts what the engine
// asked: reductions (on the Probe's wire), marks (events) and fusion buffers not given back (in
// counts that outlive it: the engine destroys it).
struct PlayedGpuCounts {
  std::atomic<int> marks{0}, buffers{0}, buffers_held{0};
};
class HostPlayedGpu final : public GpuCollectives {
 public:
  HostPlayedGpu(Collectives& host, std::shared_ptr<PlayedGpuCounts> counts = std::make_shared<PlayedGpuCounts>())
      : host_(host), counts_(std::move(counts)) {}
  void group_start() override { in_group_ = true; }
  void group_end() override {
    in_group_ = false;
    for (auto& run : deferred_) run();
    deferred_.clear();
  }
  void allreduce(const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op, void*) override {
    enqueue([=, this] {
      const size_t bytes = count * dtype_size(dtype);
      if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
      host_.allreduce(recv, bytes, dtype_size(dtype), reduce_function(dtype, op));
      if (op == DDL_AVERAGE) divide_by_world_size(recv, count, dtype, host_.size());
    });
  }
  void broadcast(void* data, size_t count, ddl_dtype dtype, int root, void*) override {
    enqueue([=, this] { host_.broadcast(data, count * dtype_size(dtype), root); });
  }
  // NCCL may write a peer's block into the output before it has read this rank's input: the
  // played allgather and alltoallv write the output's other blocks first (with garbage), so an
  // input that shares memory with them is read spoilt, as it can be on a GPU.
  void allgather(const void* send, void* recv, size_t count, ddl_dtype dtype, void*) override {
    enqueue([=, this] {
      const size_t block = count * dtype_size(dtype);
      auto* out = static_cast<char*>(recv);
      for (int r = 0; r < host_.size(); ++r)
        if (r != host_.rank()) std::memset(out + static_cast<size_t>(r) * block, 0x5a, block);
      host_.allgatherv(send, recv, std::vector<size_t>(static_cast<size_t>(host_.size()), block));
    });
  }
  void reduce_scatter(const void*, void*, size_t, ddl_dtype, ddl_reduce_op, void*) override { throw std::logic_error("not played"); }
  // Equal blocks only.
  void alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv, const std::vector<size_t>&, ddl_dtype dtype,
                 void*) override {
    enqueue([=, this] {
      const size_t block = send_counts.at(0) * dtype_size(dtype), total = block * static_cast<size_t>(host_.size());
      std::memset(recv, 0x5a, total);  // the blocks land first, then the input is read
      std::vector<char> input(static_cast<const char*>(send), static_cast<const char*>(send) + total);
      host_.alltoall(input.data(), recv, block);
    });
  }
  void* buffer(size_t bytes, void*) override {
    buffers_.emplace_back(std::max<size_t>(bytes, 1));
    ++counts_->buffers;
    ++counts_->buffers_held;
    return buffers_.back().data();
  }
  void release_buffer(void* buffer, void*) override {
    counts_->buffers_held -= static_cast<int>(std::erase_if(buffers_, [&](const std::vector<char>& b) { return b.data() == buffer; }));
  }
  void copy(void* to, const void* from, size_t bytes, void*) override {
    if (bytes > 0) std::memcpy(to, from, bytes);
  }
  void order_after(void*, void*) override {}  // one stream's order plays every stream's
  bool fuses() const override { return true; }
  Token mark(void* stream) override {
    ++counts_->marks;
    return stream == nullptr ? this : stream;
  }
  bool done(Token) override { return true; }
  void release(Token) override {}
  void abort() override {}

 private:
  void enqueue(std::function<void()> run) {
    if (in_group_)
      deferred_.push_back(std::move(run));
    else
      run();
  }
  Collectives& host_;
  std::shared_ptr<PlayedGpuCounts> counts_;
  bool in_group_ = false;
  std::vector<std::function<void()>> deferred_;
  std::list<std::vector<char>> buffers_;
};

// Worlds whose CUDA ops go to a HostPlayedGpu, rank r's counts in counts[r] (made afresh per world).
WorldOptions with_played_gpu(std::vector<std::shared_ptr<PlayedGpuCounts>>& counts) {
  WorldOptions options;
  options.config = [&counts](int rank) {
    EngineConfig c;
    auto mine = counts.at(static_cast<size_t>(rank)) = std::make_shared<PlayedGpuCounts>();
    c.gpu_collectives = [mine](Collectives& host) { return std::make_unique<HostPlayedGpu>(host, mine); };
    return c;
  };
  return options;
}

OpSpec cuda_spec(OpSpec s) {
  s.cuda = true;
  return s;
}

// `count` float32 allreduces named prefix.i of 64 elements each, submitted while the engine thread
// is parked (CUDA ones with `cuda`); checks every result and returns what went over the wire for them.
std::vector<WireAllreduce> sixteen_allreduces(RankContext& ctx, const std::string& prefix, bool cuda = false) {
  constexpr int kOps = 16;
  constexpr size_t kCount = 64;
  std::vector<std::vector<float>> in(kOps), out(kOps);
  std::vector<std::shared_ptr<OpState>> ops;
  for (int i = 0; i < kOps; ++i) {
    for (size_t j = 0; j < kCount; ++j) in[i].push_back(input(ctx.rank, i, j));
    out[i].assign(kCount, -1);
  }
  {
    Paused paused(ctx.probe);
    for (int i = 0; i < kOps; ++i)
      ops.push_back(ctx.engine->submit(fmt::format("{}.{}", prefix, i),
                                       cuda ? cuda_spec(allreduce_spec(DDL_FLOAT32, kCount)) : allreduce_spec(DDL_FLOAT32, kCount),
                                       in[i].data(), out[i].data()));
  }
  for (int i = 0; i < kOps; ++i) {
    succeeded(ops[i], fmt::format("{}.{}", prefix, i));
    bool right = true;
    for (size_t j = 0; j < kCount; ++j) right = right && out[i][j] == expected_sum(ctx.size, i, j);
    CHECK_MESSAGE(right, prefix, ".", i, " has a wrong sum");
  }
  return ctx.probe.take_allreduces();
}

std::vector<std::string> names_of(const Announcement& a) {
  std::vector<std::string> names;
  for (const auto& [name, spec] : a.submitted) names.push_back(name);
  return names;
}

// Engines whose own thread never runs a round by itself (its cycle is 30 s): every round is a
// caller's in Engine::run, so which ops run in their own round does not depend on timing.
WorldOptions callers_only(const std::string& timeline_of_rank_0 = {}) {
  WorldOptions options;
  options.config = [timeline_of_rank_0](int rank) {
    EngineConfig c;
    c.cycle_time = 30s;
    if (rank == 0) c.timeline_path = timeline_of_rank_0;
    return c;
  };
  return options;
}

// Engine::run, checked: the status, and the message when it failed.
Outcome run_op(RankContext& ctx, const std::string& name, const OpSpec& spec, const void* send, void* recv) {
  Outcome o;
  o.status = ctx.engine->run(name, spec, send, recv, o.message);
  return o;
}

// `steps` blocking allreduces named `name` of `count` floats; checks every result.
void blocking_steps(RankContext& ctx, const std::string& name, int steps, size_t count = 5) {
  for (int step = 0; step < steps; ++step) {
    std::vector<float> in, out(count, -1);
    for (size_t j = 0; j < count; ++j) in.push_back(input(ctx.rank, step, j));
    Outcome o = run_op(ctx, name, allreduce_spec(DDL_FLOAT32, count), in.data(), out.data());
    CHECK_MESSAGE(o.status == DDL_SUCCESS, name, " step ", step, ": ", o.message);
    bool right = true;
    for (size_t j = 0; j < count; ++j) right = right && out[j] == expected_sum(ctx.size, step, j);
    CHECK_MESSAGE(right, name, " step ", step, " has a wrong sum");
  }
}

// An async op submitted and waited for with Engine::wait (the waiter runs rounds where it can).
Outcome submit_and_wait(RankContext& ctx, const std::string& name, const OpSpec& spec, const void* send, void* recv) {
  Outcome o;
  std::shared_ptr<OpState> op = ctx.engine->submit(name, spec, send, recv);
  o.status = ctx.engine->wait(*op, o.message);
  return o;
}

// callers_only(), with a short timeout: a deadlock ends as timeouts rather than hanging the test.
WorldOptions callers_only_with_timeout() {
  WorldOptions options;
  options.config = [](int) {
    EngineConfig c;
    c.cycle_time = 30s;
    c.timeout = 5s;
    return c;
  };
  return options;
}

using CompleteOp = Outcome (*)(RankContext&, const std::string&, const OpSpec&, const void*, void*);

// Two threads of this rank complete "first.R" and "second.R" (one float each) with `complete`:
// even ranks start "first" and 20 ms later "second", odd ranks the other way round, so each
// thread's op can only complete once the other ranks' other thread has submitted it. Checks both.
void two_threads_in_crossed_orders(RankContext& ctx, int round, CompleteOp complete) {
  std::vector<float> a{static_cast<float>(ctx.rank + 1)}, b{static_cast<float>(10 * (ctx.rank + 1))};
  Outcome first, second;
  std::function<void()> run_first = [&] {
    first = complete(ctx, fmt::format("first.{}", round), allreduce_spec(DDL_FLOAT32, 1), a.data(), a.data());
  };
  std::function<void()> run_second = [&] {
    second = complete(ctx, fmt::format("second.{}", round), allreduce_spec(DDL_FLOAT32, 1), b.data(), b.data());
  };
  const bool even = ctx.rank % 2 == 0;
  std::thread early(even ? run_first : run_second);
  std::this_thread::sleep_for(20ms);  // the early thread holds the round, waiting for the others
  std::thread late(even ? run_second : run_first);
  early.join();
  late.join();
  CHECK_MESSAGE(first.status == DDL_SUCCESS, first.message);
  CHECK_MESSAGE(second.status == DDL_SUCCESS, second.message);
  CHECK(a[0] == static_cast<float>(ctx.size * (ctx.size + 1) / 2));
  CHECK(b[0] == static_cast<float>(10 * ctx.size * (ctx.size + 1) / 2));
}

// Three ops "metric" completed with `complete`; then the last rank's transport breaks, and the
// next "metric" fails on every rank (the broken one: its own error; the others: a lost peer or a
// timeout), as does every later one, with the same error.
void broken_transport_fails_every_rank(RankContext& ctx, CompleteOp complete) {
  const int broken = ctx.size - 1;
  for (int step = 0; step < 3; ++step) {
    float x = 1;
    Outcome o = complete(ctx, "metric", allreduce_spec(DDL_FLOAT32, 1), &x, &x);
    CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
    CHECK(x == static_cast<float>(ctx.size));
  }
  if (ctx.rank == broken) ctx.probe.sever();
  float x = 1;
  Outcome failed = complete(ctx, "metric", allreduce_spec(DDL_FLOAT32, 1), &x, &x);
  if (ctx.rank == broken) {
    CHECK(failed.status == DDL_ERROR_PEER_FAILED);
    CHECK(failed.message == fmt::format("rank {}: lost a peer talking to the other ranks: transport torn down by the test", ctx.rank));
  } else {
    CHECK((failed.status == DDL_ERROR_PEER_FAILED || failed.status == DDL_ERROR_TIMEOUT));
    CHECK(failed.message.rfind(fmt::format("rank {}: ", ctx.rank), 0) == 0);
  }
  Outcome later = complete(ctx, "metric", allreduce_spec(DDL_FLOAT32, 1), &x, &x);
  CHECK(later.status == failed.status);
  CHECK(later.message == failed.message);
  ctx.engine.reset();
}

bool proposed_by_id(const Announcement& a) { return a.submitted.empty() && a.cached.size() == 1 && !a.proposal.empty(); }

// The worlds of the crossed-order tests below: 2 and 3 ranks (an odd count leaves one rank without a
// partner in a pairing), over both transports.
void for_each_small_world(const WorldOptions& options, const std::function<void(RankContext&)>& body) {
  for (Transport t : kTransports)
    for (int size : {2, 3}) run_world(t, size, options, body);
}

// The engine's own thread as in production (a 1 ms cycle) and a short DDL_TIMEOUT.
WorldOptions default_cycle_with_timeout(std::chrono::milliseconds timeout) {
  WorldOptions options;
  options.config = [timeout](int) {
    EngineConfig c;
    c.timeout = timeout;
    return c;
  };
  return options;
}

OpSpec allgather_any_spec(ddl_dtype dtype) {
  OpSpec s;
  s.kind = OpKind::AllgatherAny;
  s.dtype = dtype;
  return s;
}

// One thread's share of a crossed-order step: `job` names what it runs, under names of step `step`.
//   0: an allgather of rows that differ in number by rank, submitted and waited for (ddl_gathered's way)
//   1: a blocking allreduce (Engine::run: the caller proposes it or runs the rounds itself)
//   2: a group of four allreduces submitted together and waited for in reverse (a fused group)
// Every result is checked; returns the failures' messages.
std::vector<std::string> crossed_job(RankContext& ctx, int step, int job) {
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  };
  if (job == 0) {
    const std::string name = fmt::format("gather.{}", step);
    std::vector<int32_t> rows(static_cast<size_t>(ctx.rank + 1) * 3, ctx.rank);
    std::shared_ptr<OpState> op =
        ctx.engine->submit_with_counts(name, allgather_any_spec(DDL_INT32), rows.data(), nullptr, {rows.size()}, {});
    std::string message;
    const ddl_status status = ctx.engine->wait(*op, message);
    expect(status == DDL_SUCCESS, name + ": " + message);
    if (status != DDL_SUCCESS) return failures;
    std::vector<int32_t> want;
    for (int r = 0; r < ctx.size; ++r) want.insert(want.end(), static_cast<size_t>(r + 1) * 3, r);
    std::vector<int32_t> got(op->gathered().size() / sizeof(int32_t));
    std::memcpy(got.data(), op->gathered().data(), got.size() * sizeof(int32_t));
    expect(got == want, name + " gathered the wrong rows");
  } else if (job == 1) {
    const std::string name = fmt::format("blocking.{}", step);
    std::vector<float> x(7, static_cast<float>(ctx.rank + 1));
    Outcome o = run_op(ctx, name, allreduce_spec(DDL_FLOAT32, x.size()), x.data(), x.data());
    expect(o.status == DDL_SUCCESS, name + ": " + o.message);
    expect(o.status != DDL_SUCCESS || x[6] == static_cast<float>(ctx.size * (ctx.size + 1) / 2), name + " has a wrong sum");
  } else {
    constexpr int kParts = 4;
    std::vector<std::vector<float>> in(kParts), out(kParts);
    std::vector<std::shared_ptr<OpState>> ops;
    for (int i = 0; i < kParts; ++i) {
      for (size_t j = 0; j < 16; ++j) in[i].push_back(input(ctx.rank, i, j));
      out[i].assign(16, -1);
      ops.push_back(ctx.engine->submit(fmt::format("group.{}.{}", step, i), allreduce_spec(DDL_FLOAT32, 16), in[i].data(), out[i].data()));
    }
    for (int i = kParts - 1; i >= 0; --i) {
      std::string message;
      const ddl_status status = ctx.engine->wait(*ops[i], message);
      expect(status == DDL_SUCCESS, fmt::format("group.{}.{}: {}", step, i, message));
      bool right = status == DDL_SUCCESS;
      for (size_t j = 0; j < 16 && right; ++j) right = out[i][j] == expected_sum(ctx.size, i, j);
      expect(status != DDL_SUCCESS || right, fmt::format("group.{}.{} has a wrong sum", step, i));
    }
  }
  return failures;
}

// Three threads of this rank run the three jobs of `step`, thread t job t on even ranks and job 2 - t
// on odd ones, started 5 ms apart: each rank's first waiter waits for an op its peers start last.
void three_threads_in_crossed_orders(RankContext& ctx, int step) {
  std::vector<std::vector<std::string>> failures(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    const int job = ctx.rank % 2 == 0 ? t : 2 - t;
    threads.emplace_back([&, t, job] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * t));
      failures[static_cast<size_t>(t)] = crossed_job(ctx, step, job);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& f : failures)
    for (const auto& message : f) FAIL_CHECK(message);
}

// GPU memory as the engine's staging of CUDA ops sees it, played by host memory: the engine cannot
// tell (it only copies through DeviceMemory), and the copies are counted. CI has no GPU; the `gpu`
// tests run the same staging with the CUDA runtime's copies.
class HostAsDeviceMemory final : public DeviceMemory {
 public:
  void to_host(void* host, const void* device, size_t bytes, void*) override {
    if (refuse_next_copy_to_host.exchange(false)) throw ddl::Error("the test refused this copy");
    if (bytes > 0) std::memcpy(host, device, bytes);
    ++copies_to_host;
  }
  void to_device(void* device, const void* host, size_t bytes, void*) override {
    if (bytes > 0) std::memcpy(device, host, bytes);
    ++copies_to_device;
  }
  std::atomic<int> copies_to_host{0}, copies_to_device{0};
  std::atomic<bool> refuse_next_copy_to_host{false};
};

}  // namespace

TEST_SUITE("engine_threads") {
  TEST_CASE("allreduces submitted in one cycle are fused: one collective per dtype, results right") {
    std::map<std::string, std::string> timelines;  // world -> rank 0's timeline
    for (Transport t : kTransports) {
      for (int size : kSizes) {
        const std::string timeline = temp_path("fusion");
        timelines[describe(t, size)] = timeline;
        WorldOptions options;
        options.config = [&](int rank) {
          EngineConfig c;
          if (rank == 0) c.timeline_path = timeline;
          return c;
        };
        run_world(t, size, options, [](RankContext& ctx) {
          constexpr int kFloats = 16, kInts = 4;
          std::vector<std::vector<float>> fin(kFloats), fout(kFloats);
          std::vector<std::vector<int32_t>> iin(kInts), iout(kInts);
          size_t float_elements = 0, int_elements = 0;
          for (int i = 0; i < kFloats; ++i) {
            const size_t n = 8 + static_cast<size_t>(i);
            for (size_t j = 0; j < n; ++j) fin[i].push_back(input(ctx.rank, i, j));
            fout[i].assign(n, -1);
            float_elements += n;
          }
          for (int i = 0; i < kInts; ++i) {
            const size_t n = 3 + static_cast<size_t>(i);
            for (size_t j = 0; j < n; ++j) iin[i].push_back((ctx.rank + 1) * 1000 + i * 10 + static_cast<int32_t>(j));
            iout[i].assign(n, -1);
            int_elements += n;
          }
          std::vector<std::shared_ptr<OpState>> ops;
          {
            Paused paused(ctx.probe);
            // Interleaved, so grouping by dtype (not adjacency) is what fuses them.
            for (int i = 0; i < kFloats; ++i) {
              ops.push_back(
                  ctx.engine->submit(fmt::format("f.{}", i), allreduce_spec(DDL_FLOAT32, fin[i].size()), fin[i].data(), fout[i].data()));
              if (i % 4 == 0)
                ops.push_back(ctx.engine->submit(fmt::format("n.{}", i / 4), allreduce_spec(DDL_INT32, iin[i / 4].size()),
                                                 iin[i / 4].data(), iout[i / 4].data()));
            }
          }
          for (auto& op : ops) succeeded(op, "a fused allreduce");
          for (int i = 0; i < kFloats; ++i) {
            bool right = true;
            for (size_t j = 0; j < fout[i].size(); ++j) right = right && fout[i][j] == expected_sum(ctx.size, i, j);
            CHECK_MESSAGE(right, "f.", i, " has a wrong sum");
          }
          const int32_t ranks_sum = ctx.size * (ctx.size + 1) / 2;
          for (int i = 0; i < kInts; ++i) {
            bool right = true;
            for (size_t j = 0; j < iout[i].size(); ++j)
              right = right && iout[i][j] == ranks_sum * 1000 + ctx.size * (i * 10 + static_cast<int32_t>(j));
            CHECK_MESSAGE(right, "n.", i, " has a wrong sum");
          }
          // Twenty ops, two collectives: the floats (first announced) and the int32s, each whole.
          CHECK_WIRE(ctx.probe.take_allreduces(), {{float_elements, 4}, {int_elements, 4}});
        });
      }
    }
    // Rank 0's timeline (closed with its engine) shows every float op reduced in the same collective,
    // and the int32 ops in another; over Gloo each op was copied into a fusion buffer and out again,
    // while shared memory reduces straight from the ops' buffers.
    for (const auto& entry : timelines) {  // no structured bindings: clang 14 cannot capture them in INFO
      const std::string& world = entry.first;
      const std::string& path = entry.second;
      INFO(world);
      std::ifstream file(path);
      REQUIRE(file.good());
      const auto doc = nlohmann::json::parse(file);
      std::filesystem::remove(path);
      std::map<std::string, std::set<std::string>> phases;  // op -> phases
      std::set<double> float_allreduce_starts, int_allreduce_starts;
      for (const auto& e : doc.at("traceEvents")) {
        if (e.at("ph") != "X") continue;
        const std::string op = e.at("args").at("op"), phase = e.at("name");
        phases[op].insert(phase);
        if (phase == "ALLREDUCE") (op[0] == 'f' ? float_allreduce_starts : int_allreduce_starts).insert(e.at("ts").get<double>());
      }
      CHECK(phases.size() == 20);
      for (const auto& phase_entry : phases) {
        const std::string& op = phase_entry.first;
        const std::set<std::string>& seen = phase_entry.second;
        INFO(op);
        const size_t copies = world.ends_with("gloo") ? 1 : 0;
        CHECK(seen.count("MEMCPY_IN_FUSION_BUFFER") == copies);
        CHECK(seen.count("MEMCPY_OUT_FUSION_BUFFER") == copies);
        CHECK(seen.count("ALLREDUCE") == 1);
      }
      CHECK(float_allreduce_starts.size() == 1);
      CHECK(int_allreduce_starts.size() == 1);
    }
  }

  TEST_CASE("a fused allreduce larger than shared memory's chunks is right: ops cut by chunk and segment edges, in place or not") {
    for_each_world({}, [](RankContext& ctx) {
      // 2.4 MB of float32 together: three of shared memory's 1 MiB chunks, whose edges and the
      // ranks' segments within them fall inside ops.
      const std::vector<size_t> counts{1, 300001, 7, 262144, 33333, 5};
      size_t total = 0;
      for (size_t c : counts) total += c;
      struct Variant {
        ddl_reduce_op reduce;
        double prescale_of_op_3;  // other than 1: the transport gets a fusion buffer after all
        double postscale;
      };
      const Variant variants[] = {{DDL_SUM, 1, 1}, {DDL_AVERAGE, 1, 0.5}, {DDL_SUM, 2, 1}};
      for (int v = 0; v < 3; ++v) {
        const Variant& variant = variants[v];
        INFO("variant ", v);
        std::vector<std::vector<float>> in(counts.size()), out(counts.size());
        std::vector<std::shared_ptr<OpState>> ops;
        {
          Paused paused(ctx.probe);
          for (size_t i = 0; i < counts.size(); ++i) {
            for (size_t j = 0; j < counts[i]; ++j) in[i].push_back(input(ctx.rank, static_cast<int>(i), j));
            const bool in_place = i % 2 == 0;
            if (!in_place) out[i].assign(counts[i], -1);
            OpSpec spec = allreduce_spec(DDL_FLOAT32, counts[i]);
            spec.reduce = variant.reduce;
            spec.prescale = i == 3 ? variant.prescale_of_op_3 : 1;
            spec.postscale = variant.postscale;
            ops.push_back(ctx.engine->submit(fmt::format("big.{}.{}", v, i), spec, in[i].data(), in_place ? in[i].data() : out[i].data()));
          }
        }
        for (size_t i = 0; i < counts.size(); ++i) {
          succeeded(ops[i], fmt::format("big.{}.{}", v, i));
          const std::vector<float>& result = i % 2 == 0 ? in[i] : out[i];
          const double factor =
              (i == 3 ? variant.prescale_of_op_3 : 1) * variant.postscale / (variant.reduce == DDL_AVERAGE ? ctx.size : 1);
          size_t wrong = 0;
          for (size_t j = 0; j < counts[i]; ++j)
            wrong += result[j] != static_cast<float>(expected_sum(ctx.size, static_cast<int>(i), j) * factor) ? 1 : 0;
          CHECK_MESSAGE(wrong == 0, "big.", v, ".", i, ": ", wrong, " wrong elements");
        }
        CHECK_WIRE(ctx.probe.take_allreduces(), {{total, 4}});
      }
    });
  }

  TEST_CASE("the response cache: a repeated op is announced by id; a new shape is renegotiated; a shape only one rank changed fails") {
    for_each_world({}, [](RankContext& ctx) {
      constexpr int kOps = 5;
      const int last = ctx.size - 1;
      // One training step: grad.0 .. grad.4, grad.0 with `first_count` elements, the others 6; returns
      // grad.0's outcome after checking the others, and this rank's one announcement of the step.
      auto step = [&](uint64_t first_count, Announcement& announced) {
        std::vector<std::vector<float>> in(kOps), out(kOps);
        std::vector<std::shared_ptr<OpState>> ops;
        for (int i = 0; i < kOps; ++i) {
          const size_t n = i == 0 ? first_count : 6;
          for (size_t j = 0; j < n; ++j) in[i].push_back(input(ctx.rank, i, j));
          out[i].assign(n, -1);
        }
        {
          Paused paused(ctx.probe);
          for (int i = 0; i < kOps; ++i)
            ops.push_back(
                ctx.engine->submit(fmt::format("grad.{}", i), allreduce_spec(DDL_FLOAT32, in[i].size()), in[i].data(), out[i].data()));
        }
        for (int i = 1; i < kOps; ++i) succeeded(ops[i], fmt::format("grad.{}", i));
        Outcome first = outcome(ops[0]);
        if (first.status == DDL_SUCCESS) {
          bool right = true;
          for (size_t j = 0; j < first_count; ++j) right = right && out[0][j] == expected_sum(ctx.size, 0, j);
          CHECK_MESSAGE(right, "grad.0 has a wrong sum");
        }
        auto announcements = ctx.probe.take_announcements();
        if (announcements.size() != 1)
          throw std::runtime_error(fmt::format("a step's ops were announced in {} announcements, not one", announcements.size()));
        announced = announcements[0];
        return first;
      };
      const std::vector<std::string> all{"grad.0", "grad.1", "grad.2", "grad.3", "grad.4"};
      Announcement a;

      // First step: announced in full.
      CHECK(step(4, a).status == DDL_SUCCESS);
      CHECK(names_of(a) == all);
      CHECK(a.cached.empty());
      // Every later step with the same names and shapes: only the cache ids.
      for (int repeat = 0; repeat < 2; ++repeat) {
        CHECK(step(4, a).status == DDL_SUCCESS);
        CHECK(a.submitted.empty());
        CHECK(a.cached.size() == kOps);
      }
      // grad.0 changes shape on every rank: it is announced in full, agreed again and right.
      CHECK(step(9, a).status == DDL_SUCCESS);
      CHECK(names_of(a) == std::vector<std::string>{"grad.0"});
      CHECK(a.cached.size() == kOps - 1);
      // ... and the new shape is what the cache holds now.
      CHECK(step(9, a).status == DDL_SUCCESS);
      CHECK(a.submitted.empty());
      CHECK(a.cached.size() == kOps);
      // Only the last rank changes it: grad.0 fails on every rank with both shapes named; the others run.
      Outcome mismatch = step(ctx.rank == last ? 3 : 9, a);
      CHECK(mismatch.status == DDL_ERROR_MISMATCH);
      const std::string others = ctx.size == 2 ? "rank 0" : fmt::format("rank 0-{}", last - 1);
      CHECK(
          mismatch.message ==
          fmt::format("op 'grad.0' differs between ranks: {}: allreduce float32[9] sum; rank {}: allreduce float32[3] sum", others, last));
      CHECK(a.cached.size() == (ctx.rank == last ? kOps - 1 : kOps));
      // A mismatch fails that op alone: the engine goes on, with the agreed shape still cached.
      CHECK(step(9, a).status == DDL_SUCCESS);
      CHECK(a.cached.size() == kOps);
    });
  }

  TEST_CASE("the steady state: a repeated step's ops that come one by one are announced together once per cycle, and fused") {
    // A cycle far longer than the test: in the steady state the engine thread runs no round of its
    // own, so what announces the ops is the round of the caller that waits for them.
    WorldOptions options;
    options.config = [](int) {
      EngineConfig c;
      c.cycle_time = 50s;
      return c;
    };
    for_each_world(options, [](RankContext& ctx) {
      constexpr int kOps = 8;
      size_t total = 0;
      for (int i = 0; i < kOps; ++i) total += 5 + static_cast<size_t>(i);
      // One training step: grad.i submitted one at a time (a backward pass's hooks), then every
      // one waited for; checks the sums and returns this rank's announcements of the step.
      auto step = [&](std::chrono::milliseconds between_ops) {
        ctx.sync();
        std::vector<std::vector<float>> in(kOps), out(kOps);
        std::vector<std::shared_ptr<OpState>> ops;
        for (int i = 0; i < kOps; ++i) {
          for (size_t j = 0; j < 5 + static_cast<size_t>(i); ++j) in[i].push_back(input(ctx.rank, i, j));
          out[i].assign(in[i].size(), -1);
          ops.push_back(
              ctx.engine->submit(fmt::format("grad.{}", i), allreduce_spec(DDL_FLOAT32, in[i].size()), in[i].data(), out[i].data()));
          std::this_thread::sleep_for(between_ops);
        }
        for (int i = 0; i < kOps; ++i) {
          std::string message;
          CHECK_MESSAGE(ctx.engine->wait(*ops[i], message) == DDL_SUCCESS, "grad.", i, ": ", message);
          bool right = true;
          for (size_t j = 0; j < out[i].size(); ++j) right = right && out[i][j] == expected_sum(ctx.size, i, j);
          CHECK_MESSAGE(right, "grad.", i, " has a wrong sum");
        }
        return ctx.probe.take_announcements();
      };
      auto cached_ids = [](const std::vector<Announcement>& announcements) {
        size_t ids = 0;
        for (const auto& a : announcements) {
          CHECK(a.submitted.empty());
          ids += a.cached.size();
        }
        return ids;
      };

      // The first step negotiates every op in full, as it comes.
      for (const auto& a : step(0ms)) CHECK(a.cached.empty());
      ctx.probe.take_allreduces();
      // The second step: its first op is announced as it comes (the last round announced names in
      // full), the others wait for the cycle, and the caller's wait announces them all at once.
      auto second = step(2ms);  // time for a round per op, were one run for each
      CHECK(second.size() <= 2);
      CHECK(cached_ids(second) == kOps);
      const auto second_wire = ctx.probe.take_allreduces();
      CHECK(second_wire.size() <= 2);
      // From then on every op of a step is in one announcement, and the step is one allreduce.
      auto third = step(2ms);
      CHECK(third.size() == 1);
      CHECK(cached_ids(third) == kOps);
      CHECK_WIRE(ctx.probe.take_allreduces(), {{total, 4}});
    });
  }

  TEST_CASE("only an op refused in the submitting call is marked refused; one that ran and failed is not, however soon") {
    // The C API gives a refused op no handle (handle_of): an op that was taken and then failed,
    // even one over before its submitting call returned, must still get one.
    for_each_world({}, [](RankContext& ctx) {
      std::vector<float> in(ctx.rank == ctx.size - 1 ? 3 : 5, 1.0f), out(in.size());
      auto failed = ctx.engine->submit("refusal.mismatch", allreduce_spec(DDL_FLOAT32, in.size()), in.data(), out.data());
      CHECK(outcome(failed).status == DDL_ERROR_MISMATCH);
      CHECK_FALSE(failed->refused());
      std::vector<float> five(5, 1.0f), other(5, 1.0f);
      std::shared_ptr<OpState> first, second;
      {
        Paused paused(ctx.probe);  // the first op stays in flight while the second is submitted
        first = ctx.engine->submit("refusal.twice", allreduce_spec(DDL_FLOAT32, 5), five.data(), five.data());
        second = ctx.engine->submit("refusal.twice", allreduce_spec(DDL_FLOAT32, 5), other.data(), other.data());
      }
      CHECK(second->refused());
      CHECK(outcome(second).status == DDL_ERROR_INVALID_ARGUMENT);
      succeeded(first, "refusal.twice");
      CHECK_FALSE(first->refused());
    });
  }

  TEST_CASE("float16 and bfloat16 sums round to nearest even; fp16 compression rounds float32 on the wire") {
    for_each_world({}, [](RankContext& ctx) {
      const int r = ctx.rank;
      // Ranks 0 and 1 hold the interesting values and every other rank zeros, so each element's sum
      // is one rounded addition, whatever order the transport adds in; the last element is r + 1
      // everywhere (small integers: exact).
      const uint16_t sum_1_to_n_half = ctx.size == 2 ? 0x4200 /* 3 */ : 0x4900 /* 10 */;
      const uint16_t sum_1_to_n_bf16 = ctx.size == 2 ? 0x4040 /* 3 */ : 0x4120 /* 10 */;
      auto pick = [&](uint16_t rank0, uint16_t rank1) -> uint16_t { return r == 0 ? rank0 : r == 1 ? rank1 : 0; };
      auto small_int_half = [](int v) -> uint16_t { return v == 1 ? 0x3C00 : v == 2 ? 0x4000 : v == 3 ? 0x4200 : 0x4400; };
      auto small_int_bf16 = [](int v) -> uint16_t { return v == 1 ? 0x3F80 : v == 2 ? 0x4000 : v == 3 ? 0x4040 : 0x4080; };
      std::vector<uint16_t> half_a{
          pick(0x6800, 0x3C00),  // 2048 + 1 = 2049: a tie, to even 2048 (float32 would say 2049)
          pick(0x6800, 0x4200),  // 2048 + 3 = 2051: a tie, to even 2052
          pick(0x3C00, 0x1000),  // 1 + 2^-11: a tie, to even 1
          pick(0x3C01, 0x1000),  // (1 + 2^-10) + 2^-11: a tie, to even 1 + 2^-9
          pick(0x3C00, 0x1001),  // 1 + just over 2^-11: up to 1 + 2^-10
      };
      std::vector<uint16_t> half_b{
          pick(0x7BFF, 0x4800),  // 65504 + 8 = 65512: down to 65504
          pick(0x7BFF, 0x4C00),  // 65504 + 16 = 65520: a tie, to even, which is infinity
          pick(0xE800, 0x3C00),  // -2048 + 1 = -2047: exact
          small_int_half(r + 1),
      };
      std::vector<uint16_t> bf16{
          pick(0x4380, 0x3F80),  // 256 + 1 = 257: a tie, to even 256
          pick(0x4380, 0x4040),  // 256 + 3 = 259: a tie, to even 260
          pick(0x3F80, 0x3B80),  // 1 + 2^-8: a tie, to even 1
          pick(0x3F81, 0x3B80),  // (1 + 2^-7) + 2^-8: a tie, to even 1 + 2^-6
          small_int_bf16(r + 1),
      };
      std::vector<float> compressed{
          r == 0 ? 2049.0f : 0.0f,  // becomes the half 2048 before it travels
          r == 0   ? 2048.0f
          : r == 1 ? 1.0f
                   : 0.0f,       // 2048 + 1 in half: 2048
          r == 0 ? 0.1f : 0.0f,  // the half nearest 0.1
          static_cast<float>(r + 1),
      };
      std::vector<uint16_t> half_a_out(half_a.size()), half_b_out(half_b.size()), bf16_out(bf16.size());
      std::vector<float> compressed_out(compressed.size());
      OpSpec compress = allreduce_spec(DDL_FLOAT32, compressed.size());
      compress.compress_fp16 = true;
      std::vector<std::shared_ptr<OpState>> ops;
      {
        Paused paused(ctx.probe);
        ops.push_back(ctx.engine->submit("half.a", allreduce_spec(DDL_FLOAT16, half_a.size()), half_a.data(), half_a_out.data()));
        ops.push_back(ctx.engine->submit("bf16", allreduce_spec(DDL_BFLOAT16, bf16.size()), bf16.data(), bf16_out.data()));
        ops.push_back(ctx.engine->submit("compressed", compress, compressed.data(), compressed_out.data()));
        ops.push_back(ctx.engine->submit("half.b", allreduce_spec(DDL_FLOAT16, half_b.size()), half_b.data(), half_b_out.data()));
      }
      for (auto& op : ops) succeeded(op, "a 16-bit allreduce");
      CHECK(half_a_out == std::vector<uint16_t>{0x6800, 0x6802, 0x3C00, 0x3C02, 0x3C01});
      CHECK(half_b_out == std::vector<uint16_t>{0x7BFF, 0x7C00, 0xE7FF, sum_1_to_n_half});
      CHECK(bf16_out == std::vector<uint16_t>{0x4380, 0x4382, 0x3F80, 0x3F82, sum_1_to_n_bf16});
      CHECK(compressed_out == std::vector<float>{2048.0f, 2048.0f, 0.0999755859375f, static_cast<float>(ctx.size * (ctx.size + 1) / 2)});
      // On the wire: both float16 ops fused, bfloat16 alone, and the compressed float32 as 2-byte halves.
      CHECK_WIRE(ctx.probe.take_allreduces(), {{half_a.size() + half_b.size(), 2}, {bf16.size(), 2}, {compressed.size(), 2}});
    });
  }

  TEST_CASE("rank 0's settings decide for every rank") {
    SUBCASE("rank 0's fusion threshold groups the ops on every rank") {
      WorldOptions bounded;  // rank 0 fuses up to 1 KiB; the others would not fuse at all
      bounded.config = [](int rank) {
        EngineConfig c;
        c.fusion_threshold = rank == 0 ? 1024 : 0;
        return c;
      };
      for_each_world(bounded, [](RankContext& ctx) {
        // Sixteen 256-byte ops: fused four by four, on every rank.
        CHECK_WIRE(sixteen_allreduces(ctx, "bounded"), std::vector<WireAllreduce>(4, {256, 4}));
      });
      WorldOptions unfused;  // rank 0 does not fuse; the others would fuse everything
      unfused.config = [](int rank) {
        EngineConfig c;
        c.fusion_threshold = rank == 0 ? 0 : 64u << 20;
        return c;
      };
      for_each_world(unfused, [](RankContext& ctx) {
        CHECK_WIRE(sixteen_allreduces(ctx, "unfused"), std::vector<WireAllreduce>(16, {64, 4}));
      });
    }

    SUBCASE("rank 0's timeout decides which ops have stalled") {
      WorldOptions impatient_root;  // rank 0 gives up on an op after 500 ms; the others would wait an hour
      impatient_root.config = [](int rank) {
        EngineConfig c;
        c.timeout = rank == 0 ? 500ms : std::chrono::milliseconds(3'600'000);
        return c;
      };
      for_each_world(impatient_root, [](RankContext& ctx) {
        const int last = ctx.size - 1;
        if (ctx.rank == last) {
          float x = 1, y = 0;
          Outcome o = outcome(ctx.engine->submit("orphan", allreduce_spec(DDL_FLOAT32, 1), &x, &y));
          CHECK(o.status == DDL_ERROR_TIMEOUT);
          const std::string missing = ctx.size == 2 ? "0" : fmt::format("0-{}", last - 1);
          CHECK(o.message ==
                fmt::format("op 'orphan' timed out: rank(s) {} never submitted it within the timeout of 0.5 s (raise DDL_TIMEOUT if they "
                            "are only slow)",
                            missing));
        }
        // A stalled op fails alone: the engines go on (once the orphan is gone: ops the other ranks
        // submitted while the last rank waited for it would stall too).
        ctx.sync();
        CHECK_WIRE(sixteen_allreduces(ctx, "after"), {{1024, 4}});
      });
      WorldOptions impatient_others;  // the others would give up after 1 ms; rank 0 waits an hour
      impatient_others.config = [](int rank) {
        EngineConfig c;
        c.timeout = rank == 0 ? std::chrono::milliseconds(3'600'000) : 1ms;
        return c;
      };
      for_each_world(impatient_others, [](RankContext& ctx) {
        float x = static_cast<float>(ctx.rank + 1), y = 0;
        // Rank 0 submits at once, the others 100 times their own timeout later: nothing stalls.
        if (ctx.rank != 0) std::this_thread::sleep_for(100ms);
        succeeded(ctx.engine->submit("late", allreduce_spec(DDL_FLOAT32, 1), &x, &y), "late");
        CHECK(y == static_cast<float>(ctx.size * (ctx.size + 1) / 2));
      });
    }
  }

  TEST_CASE("a rank whose transport breaks poisons every rank: pending and later ops fail, and the engines close") {
    WorldOptions options;
    options.transport_timeout = 1500ms;  // a shared-memory peer that vanished is noticed by this timeout
    for_each_world(options, [](RankContext& ctx) {
      // Rank 0 breaks in the world of 2 (the rank whose clock and threshold count), the last in the world of 4.
      const int broken = ctx.size == 2 ? 0 : ctx.size - 1;
      float x = 1, y = 0;
      succeeded(ctx.engine->submit("before", allreduce_spec(DDL_FLOAT32, 1), &x, &y), "before");
      CHECK(y == static_cast<float>(ctx.size));
      Outcome pending;
      if (ctx.rank == broken) {
        ctx.probe.sever();
        pending = outcome(ctx.engine->submit("pending", allreduce_spec(DDL_FLOAT32, 1), &x, &y));
        CHECK(pending.status == DDL_ERROR_PEER_FAILED);
        CHECK(pending.message == fmt::format("rank {}: lost a peer talking to the other ranks: transport torn down by the test", ctx.rank));
      } else {
        // Submitted by the survivors only: it waits for the broken rank until the transport fails.
        pending = outcome(ctx.engine->submit("pending", allreduce_spec(DDL_FLOAT32, 1), &x, &y));
        if (ctx.transport == Transport::SharedMemory) {
          // The segment says nothing when a rank stops coming: the survivors time out.
          CHECK(pending.status == DDL_ERROR_TIMEOUT);
          CHECK(pending.message ==
                fmt::format(
                    "rank {}: timed out talking to the other ranks: timed out after 1500 ms waiting for the other ranks (shared memory)",
                    ctx.rank));
        } else {
          // Over TCP a neighbour of the broken rank sees its connection close; the others either see
          // their neighbour's close in turn (it closes once its engine is gone) or time out.
          CHECK((pending.status == DDL_ERROR_PEER_FAILED || pending.status == DDL_ERROR_TIMEOUT));
          CHECK(pending.message.rfind(fmt::format("rank {}: ", ctx.rank), 0) == 0);
          CHECK(pending.message.find("talking to the other ranks") != std::string::npos);
        }
      }
      // Every later op fails at once with the same error: the engine stays poisoned.
      for (int i = 0; i < 3; ++i) {
        Outcome later = outcome(ctx.engine->submit(fmt::format("later.{}", i), allreduce_spec(DDL_FLOAT32, 1), &x, &y));
        CHECK(later.status == pending.status);
        CHECK(later.message == pending.message);
      }
      // And the engine closes without waiting for anyone.
      ctx.engine.reset();
    });
  }

  TEST_CASE("finalize closes the timeline: the document is whole while the engine object lives on") {
    const std::string timeline = temp_path("finalized");
    // Whichever thread drops the engine last (a ddl_wait's, after ddl_finalize returned) may destroy
    // it later; the file must not wait for that.
    run_world(Transport::SharedMemory, 2, callers_only(timeline), [&timeline](RankContext& ctx) {
      float x = 1;
      Outcome o = submit_and_wait(ctx, "logged", allreduce_spec(DDL_FLOAT32, 1), &x, &x);
      CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
      ctx.engine->finalize();
      if (ctx.rank != 0) return;
      std::ifstream file(timeline);
      REQUIRE(file.good());
      const auto doc = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
      REQUIRE_MESSAGE(!doc.is_discarded(), "the timeline is not a whole JSON document after finalize()");
      int logged = 0;
      for (const auto& e : doc.at("traceEvents")) logged += e.at("ph") == "X" && e.at("args").at("op") == "logged" ? 1 : 0;
      CHECK(logged > 0);
    });
    std::filesystem::remove(timeline);
  }

  TEST_CASE("the fast path: a blocking op every rank ran before runs in the round that announces it") {
    for (Transport t : kTransports) {
      for (int size : kSizes) {
        const std::string timeline = temp_path("fast");
        run_world(t, size, callers_only(timeline), [](RankContext& ctx) {
          constexpr int kSteps = 20;
          blocking_steps(ctx, "metric", kSteps);
          // The first is announced in full and negotiated; every later one is proposed by its cache id.
          auto announced = ctx.probe.take_announcements();
          REQUIRE(announced.size() == kSteps);
          CHECK(names_of(announced[0]) == std::vector<std::string>{"metric"});
          CHECK(announced[0].proposal.empty());
          for (int i = 1; i < kSteps; ++i) CHECK_MESSAGE(proposed_by_id(announced[i]), "step ", i);
          if (ctx.transport == Transport::SharedMemory) {
            // Shared memory reduces the proposed op's data in the round's own barrier: one allreduce
            // on the wire, the first.
            CHECK(ctx.probe.take_ran_in_round() == kSteps - 1);
            CHECK_WIRE(ctx.probe.take_allreduces(), {{5, 4}});
          } else {
            // Gloo gathers the proposals; every rank finds them alike and runs the allreduce at once.
            CHECK(ctx.probe.take_ran_in_round() == 0);
            CHECK_WIRE(ctx.probe.take_allreduces(), std::vector<WireAllreduce>(kSteps, {5, 4}));
          }
          // Average, prescale and postscale, in place: mean(2 * 4(r + 1)) / 4 = size + 1, exactly.
          for (int step = 0; step < 3; ++step) {
            OpSpec spec = allreduce_spec(DDL_FLOAT32, 3);
            spec.reduce = DDL_AVERAGE;
            spec.prescale = 2.0;
            spec.postscale = 0.25;
            std::vector<float> x(3, static_cast<float>(4 * (ctx.rank + 1)));
            Outcome o = run_op(ctx, "scaled", spec, x.data(), x.data());
            CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
            CHECK(x == std::vector<float>(3, static_cast<float>(ctx.size + 1)));
          }
          CHECK(proposed_by_id(ctx.probe.take_announcements().back()));
        });
        // Rank 0's timeline has the negotiation and the allreduce of every step, fast or not.
        INFO(describe(t, size));
        std::ifstream file(timeline);
        REQUIRE(file.good());
        const auto doc = nlohmann::json::parse(file);
        std::filesystem::remove(timeline);
        int negotiated = 0, reduced = 0;
        for (const auto& e : doc.at("traceEvents")) {
          if (e.at("ph") != "X" || e.at("args").at("op") != "metric") continue;
          negotiated += e.at("name") == "NEGOTIATE" ? 1 : 0;
          reduced += e.at("name") == "allreduce" ? 1 : 0;  // a single op's phase is named after its kind
        }
        CHECK(negotiated == 20);
        CHECK(reduced == 20);
      }
    }
  }

  TEST_CASE("the fast path: unnamed allreduces, barriers and broadcasts run in their own round from the first") {
    for (Transport t : kTransports) {
      for (int size : kSizes) {
        run_world(t, size, callers_only(), [](RankContext& ctx) {
          constexpr int kSteps = 10;
          const int root = ctx.size - 1;
          for (int step = 0; step < kSteps; ++step) {
            std::vector<float> x{input(ctx.rank, step, 0), input(ctx.rank, step, 1)};
            Outcome o = run_op(ctx, "", allreduce_spec(DDL_FLOAT32, 2), x.data(), x.data());
            CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
            CHECK(x == std::vector<float>{expected_sum(ctx.size, step, 0), expected_sum(ctx.size, step, 1)});
            OpSpec barrier;
            barrier.kind = OpKind::Barrier;
            o = run_op(ctx, "", barrier, nullptr, nullptr);
            CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
            OpSpec broadcast = allreduce_spec(DDL_INT64, 3);
            broadcast.kind = OpKind::Broadcast;
            broadcast.root = root;
            std::vector<int64_t> b(3, ctx.rank == root ? 1000 + step : -1);
            o = run_op(ctx, "", broadcast, b.data(), b.data());
            CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
            CHECK(b == std::vector<int64_t>(3, 1000 + step));
          }
          // Unnamed ops are numbered alike on every rank: each was proposed at once, and agreed.
          auto announced = ctx.probe.take_announcements();
          REQUIRE(announced.size() == 3 * kSteps);
          for (const auto& a : announced) CHECK((a.submitted.size() == 1 && !a.proposal.empty()));
          if (ctx.transport == Transport::SharedMemory) {
            CHECK(ctx.probe.take_ran_in_round() == 3 * kSteps);
            CHECK_WIRE(ctx.probe.take_allreduces(), {});
          } else {
            CHECK_WIRE(ctx.probe.take_allreduces(), std::vector<WireAllreduce>(kSteps, {2, 4}));
          }
        });
      }
    }
  }

  TEST_CASE("the fast path: an op every rank proposed but too large for the round's own exchange runs as the usual collective") {
    for_each_world(callers_only(), [](RankContext& ctx) {
      // 80 KB: over what shared memory reduces inside the round (32 KiB on up to 4 ranks).
      constexpr size_t kCount = 20'000;
      constexpr int kSteps = 4;
      blocking_steps(ctx, "big", kSteps, kCount);
      auto announced = ctx.probe.take_announcements();
      REQUIRE(announced.size() == kSteps);
      CHECK(announced[0].proposal.empty());
      for (int i = 1; i < kSteps; ++i) CHECK_MESSAGE(proposed_by_id(announced[i]), "step ", i);
      // Agreed in the round (no second negotiation), then reduced as any allreduce of that size.
      CHECK(ctx.probe.take_ran_in_round() == 0);
      CHECK_WIRE(ctx.probe.take_allreduces(), std::vector<WireAllreduce>(kSteps, {kCount, 4}));
      // A broadcast larger than a slot's half (512 KiB): agreed, then broadcast in chunks.
      const int root = ctx.size - 1;
      for (int step = 0; step < 3; ++step) {
        OpSpec broadcast = allreduce_spec(DDL_INT32, 200'000);
        broadcast.kind = OpKind::Broadcast;
        broadcast.root = root;
        std::vector<int32_t> b(200'000, ctx.rank == root ? 7 * (step + 1) : -1);
        Outcome o = run_op(ctx, "big.broadcast", broadcast, b.data(), b.data());
        CHECK_MESSAGE(o.status == DDL_SUCCESS, o.message);
        CHECK(b == std::vector<int32_t>(200'000, 7 * (step + 1)));
      }
      announced = ctx.probe.take_announcements();
      REQUIRE(announced.size() == 3);
      CHECK(proposed_by_id(announced[2]));
      CHECK(ctx.probe.take_ran_in_round() == 0);
    });
  }

  TEST_CASE("the fast path: a rank that switches to another shape gets the mismatch error on every rank, then the fast path resumes") {
    for_each_world(callers_only(), [](RankContext& ctx) {
      const int last = ctx.size - 1;
      blocking_steps(ctx, "metric", 3);
      const size_t count = ctx.rank == last ? 3 : 5;
      std::vector<float> in(count, 1.0f), out(count, -1);
      Outcome mismatch = run_op(ctx, "metric", allreduce_spec(DDL_FLOAT32, count), in.data(), out.data());
      CHECK(mismatch.status == DDL_ERROR_MISMATCH);
      const std::string others = ctx.size == 2 ? "rank 0" : fmt::format("rank 0-{}", last - 1);
      CHECK(
          mismatch.message ==
          fmt::format("op 'metric' differs between ranks: {}: allreduce float32[5] sum; rank {}: allreduce float32[3] sum", others, last));
      CHECK(out == std::vector<float>(count, -1));  // nothing ran
      ctx.probe.take_announcements();
      ctx.probe.take_ran_in_round();
      // The agreed shape is still cached: the next steps are proposed by id, and agreed.
      blocking_steps(ctx, "metric", 3);
      for (const auto& a : ctx.probe.take_announcements()) CHECK(proposed_by_id(a));
      if (ctx.transport == Transport::SharedMemory) CHECK(ctx.probe.take_ran_in_round() == 3);
    });
  }

  TEST_CASE("the fast path: a rank with an op in flight negotiates instead, and every rank still gets its results") {
    for_each_world(callers_only(), [](RankContext& ctx) {
      blocking_steps(ctx, "metric", 2);
      float bg_in = static_cast<float>(ctx.rank + 1), bg_out = -1;
      std::shared_ptr<OpState> bg;
      if (ctx.rank == 0) bg = ctx.engine->submit("background", allreduce_spec(DDL_FLOAT32, 1), &bg_in, &bg_out);
      blocking_steps(ctx, "metric", 1);  // rank 0 cannot propose: "background" is in flight on it
      if (ctx.rank != 0) bg = ctx.engine->submit("background", allreduce_spec(DDL_FLOAT32, 1), &bg_in, &bg_out);
      // Waited for as ddl_wait does (the waiter runs the rounds): rank 0's engine thread, whose last
      // round announced only a cached op, would run its next round a cycle (30 s here) after the last.
      std::string message;
      CHECK_MESSAGE(ctx.engine->wait(*bg, message) == DDL_SUCCESS, "background: ", message);
      CHECK(bg_out == static_cast<float>(ctx.size * (ctx.size + 1) / 2));
      ctx.sync();  // every engine thread is done with "background"
      ctx.probe.take_announcements();
      ctx.probe.take_ran_in_round();
      blocking_steps(ctx, "metric", 2);
      for (const auto& a : ctx.probe.take_announcements()) CHECK(proposed_by_id(a));
    });
  }

  TEST_CASE("blocking ops from two threads of each rank, started in different orders on different ranks, all complete") {
    for_each_world(callers_only_with_timeout(), [](RankContext& ctx) {
      for (int round = 0; round < 5; ++round) two_threads_in_crossed_orders(ctx, round, run_op);
    });
  }

  TEST_CASE(
      "async ops waited for from two threads of each rank, in different orders on different ranks, between blocking ops, all complete") {
    for_each_world(callers_only_with_timeout(), [](RankContext& ctx) {
      // Whichever thread waits first runs the rounds; the late thread's op completes through those
      // rounds, or the engine thread's once the early waiter is done.
      for (int round = 0; round < 5; ++round) {
        two_threads_in_crossed_orders(ctx, round, submit_and_wait);
        blocking_steps(ctx, "metric", 1);
      }
      // Many ops in flight, waited for in the reverse order: each wait runs rounds until its own
      // op is done, and the ones finished meanwhile are found done.
      constexpr int kOps = 32;
      std::vector<std::vector<float>> in(kOps), out(kOps);
      std::vector<std::shared_ptr<OpState>> ops;
      for (int i = 0; i < kOps; ++i) {
        for (size_t j = 0; j < 8; ++j) in[i].push_back(input(ctx.rank, i, j));
        out[i].assign(8, -1);
        ops.push_back(ctx.engine->submit(fmt::format("many.{}", i), allreduce_spec(DDL_FLOAT32, 8), in[i].data(), out[i].data()));
      }
      for (int i = kOps - 1; i >= 0; --i) {
        std::string message;
        CHECK_MESSAGE(ctx.engine->wait(*ops[i], message) == DDL_SUCCESS, message);
        for (size_t j = 0; j < 8; ++j) CHECK(out[i][j] == expected_sum(ctx.size, i, j));
      }
    });
  }

  TEST_CASE("three threads per rank in crossed orders: allgathers, blocking, async and grouped allreduces all complete, on 2 and 3 ranks") {
    for_each_small_world(default_cycle_with_timeout(10s), [](RankContext& ctx) {
      for (int step = 0; step < 4; ++step) three_threads_in_crossed_orders(ctx, step);
    });
    for_each_small_world(callers_only_with_timeout(), [](RankContext& ctx) {
      for (int step = 0; step < 4; ++step) three_threads_in_crossed_orders(ctx, step);
    });
  }

  TEST_CASE("an op one rank never submits fails on every rank within DDL_TIMEOUT while other threads' crossed ops complete") {
    constexpr auto kTimeout = 1500ms;
    for_each_small_world(default_cycle_with_timeout(kTimeout), [&](RankContext& ctx) {
      // Every rank but the last waits on "lonely" from a thread of its own, as a TensorFlow executor
      // thread would, while three threads per rank run crossed steps; the last never submits it.
      const bool submits = ctx.rank != ctx.size - 1;
      // No timed check: the world's watchdog (60 s) is the bound, and a hang aborts the test program.
      Outcome lonely;
      std::thread waiter([&] {
        if (!submits) return;
        float x = 1;
        lonely = submit_and_wait(ctx, "lonely", allreduce_spec(DDL_FLOAT32, 1), &x, &x);
      });
      for (int step = 0; step < 3; ++step) three_threads_in_crossed_orders(ctx, step);
      waiter.join();
      if (submits) {
        CHECK(lonely.status == DDL_ERROR_TIMEOUT);
        CHECK_MESSAGE(
            lonely.message.find(fmt::format("op 'lonely' timed out: rank(s) {} never submitted it", ctx.size - 1)) != std::string::npos,
            lonely.message);
      }
      // The world goes on after the timeout: a later op runs on every rank.
      std::vector<float> y(1, 1.0f);
      Outcome after = submit_and_wait(ctx, "after_lonely", allreduce_spec(DDL_FLOAT32, 1), y.data(), y.data());
      CHECK_MESSAGE(after.status == DDL_SUCCESS, after.message);
      CHECK(y[0] == static_cast<float>(ctx.size));
    });
  }

  TEST_CASE("unnamed groups of different sizes fail on every rank, and later unnamed ops fail at once: no wrong value") {
    for_each_small_world(default_cycle_with_timeout(3s), [](RankContext& ctx) {
      // Each rank groups rank + 1 unnamed allreduces: every part of every rank fails, none is paired.
      const int parts = ctx.rank + 1;
      std::vector<float> x(static_cast<size_t>(parts), static_cast<float>(ctx.rank + 1));
      std::vector<std::shared_ptr<OpState>> ops;
      for (int i = 0; i < parts; ++i) {
        OpSpec s = allreduce_spec(DDL_FLOAT32, 1);
        s.group_size = static_cast<uint32_t>(parts);
        ops.push_back(ctx.engine->submit("", s, &x[static_cast<size_t>(i)], &x[static_cast<size_t>(i)]));
      }
      for (int i = 0; i < parts; ++i) {
        Outcome o = outcome(ops[static_cast<size_t>(i)]);
        CHECK_MESSAGE(o.status != DDL_SUCCESS, "part ", i, " of the group ran");
        CHECK(x[static_cast<size_t>(i)] == static_cast<float>(ctx.rank + 1));  // untouched
      }
      ctx.sync();
      // The order is broken on every rank: an unnamed op fails at once (blocking or not), naming the first failure.
      float y = 1;
      Outcome blocking = run_op(ctx, "", allreduce_spec(DDL_FLOAT32, 1), &y, &y);
      CHECK(blocking.status == DDL_ERROR_MISMATCH);
      CHECK_MESSAGE(blocking.message.find("out of step since an earlier one failed") != std::string::npos, blocking.message);
      CHECK_MESSAGE(blocking.message.find("The first failure: op 'unnamed.0' differs between ranks") != std::string::npos,
                    blocking.message);
      CHECK(y == 1.0f);
      // Named ops go on.
      Outcome named = run_op(ctx, "named", allreduce_spec(DDL_FLOAT32, 1), &y, &y);
      CHECK_MESSAGE(named.status == DDL_SUCCESS, named.message);
      CHECK(y == static_cast<float>(ctx.size));
    });
  }

  TEST_CASE("an op submitted under the name of a blocking op that another thread is proposing is refused at once; the rest run") {
    for_each_world(callers_only(), [](RankContext& ctx) {
      blocking_steps(ctx, "dup", 1);  // every rank can now propose "dup" by its cache id
      std::vector<float> a(5), b(5, 1.0f), other(1, static_cast<float>(ctx.rank + 1));
      for (size_t j = 0; j < a.size(); ++j) a[j] = input(ctx.rank, 0, j);
      std::shared_ptr<OpState> others;
      Outcome proposed;
      if (ctx.rank == 0) {
        // Thread `proposer` proposes "dup" and is parked in that round, its op in neither the inbox
        // nor in flight: another "dup" must be refused in the submitting call all the same (queued,
        // it would be announced twice or left waiting for a second "dup" of the other ranks).
        ctx.probe.hold();
        std::thread proposer([&] { proposed = run_op(ctx, "dup", allreduce_spec(DDL_FLOAT32, a.size()), a.data(), a.data()); });
        const auto join = std::shared_ptr<void>(nullptr, [&](void*) { proposer.join(); });  // even when a check throws
        REQUIRE(ctx.probe.wait_parked());
        std::shared_ptr<OpState> queued = ctx.engine->submit("dup", allreduce_spec(DDL_FLOAT32, b.size()), b.data(), b.data());
        ctx.probe.resume();
        CHECK(queued->refused());
        Outcome refused = outcome(queued);
        CHECK(refused.status == DDL_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE(refused.message.find("already in flight") != std::string::npos, refused.message);
        ctx.sync();
        others = ctx.engine->submit("others", allreduce_spec(DDL_FLOAT32, 1), other.data(), other.data());
      } else {
        ctx.sync();  // the other ranks come with an op in flight: the proposal does not run, "dup" goes in flight
        others = ctx.engine->submit("others", allreduce_spec(DDL_FLOAT32, 1), other.data(), other.data());
        proposed = run_op(ctx, "dup", allreduce_spec(DDL_FLOAT32, a.size()), a.data(), a.data());
      }
      succeeded(others, "others");
      CHECK(other[0] == static_cast<float>(ctx.size * (ctx.size + 1) / 2));
      CHECK_MESSAGE(proposed.status == DDL_SUCCESS, proposed.message);  // rank 0's proposer has been joined
      for (size_t j = 0; j < a.size(); ++j) CHECK(a[j] == expected_sum(ctx.size, 0, j));
    });
  }

  TEST_CASE("the fast path: a rank whose transport breaks poisons every rank's blocking ops") {
    WorldOptions options = callers_only();
    options.transport_timeout = 1500ms;
    for_each_world(options, [](RankContext& ctx) { broken_transport_fails_every_rank(ctx, run_op); });
  }

  TEST_CASE("a waiter running the rounds when the transport breaks gets the error from its wait, on every rank") {
    WorldOptions options = callers_only();
    options.transport_timeout = 1500ms;
    for_each_world(options, [](RankContext& ctx) { broken_transport_fails_every_rank(ctx, submit_and_wait); });
  }

  TEST_CASE(
      "CUDA ops through host memory (DDL_CUDA_VIA_HOST, shared GPUs): every CUDA op is right, allreduces fuse, a failed copy fails one "
      "op") {
    std::vector<std::shared_ptr<HostAsDeviceMemory>> memories;
    WorldOptions options;
    options.config = [&](int rank) {
      EngineConfig c;
      c.cuda_via_host = true;
      c.device_memory = memories.at(static_cast<size_t>(rank));
      return c;
    };
    for (Transport t : kTransports) {
      for (int size : {2, 3, 4}) {
        memories.clear();
        for (int r = 0; r < size; ++r) memories.push_back(std::make_shared<HostAsDeviceMemory>());
        run_world(t, size, options, [&](RankContext& ctx) {
          HostAsDeviceMemory& memory = *memories.at(static_cast<size_t>(ctx.rank));
          const auto n = static_cast<size_t>(ctx.size);
          // Sixteen allreduces agreed together: one collective on the wire, as host ops fuse.
          constexpr int kOps = 16;
          CHECK_WIRE(sixteen_allreduces(ctx, "grad", true), {{kOps * 64, 4}});
          CHECK(memory.copies_to_host == kOps);
          CHECK(memory.copies_to_device == kOps);

          // An average, in place.
          std::vector<double> avg{static_cast<double>(ctx.rank), 2.0 * ctx.rank};
          OpSpec average = cuda_spec(allreduce_spec(DDL_FLOAT64, 2));
          average.dtype = DDL_FLOAT64;
          average.reduce = DDL_AVERAGE;
          succeeded(ctx.engine->submit("avg", average, avg.data(), avg.data()), "avg");
          CHECK(avg == std::vector<double>{(ctx.size - 1) / 2.0, static_cast<double>(ctx.size - 1)});

          // A broadcast from the last rank.
          std::vector<int32_t> b(3, ctx.rank == ctx.size - 1 ? 7 : -1);
          OpSpec broadcast = cuda_spec(allreduce_spec(DDL_INT32, 3));
          broadcast.kind = OpKind::Broadcast;
          broadcast.root = ctx.size - 1;
          succeeded(ctx.engine->submit("bcast", broadcast, b.data(), b.data()), "bcast");
          CHECK(b == std::vector<int32_t>(3, 7));

          // An allgather of two elements per rank.
          std::vector<int64_t> mine{ctx.rank * 10, ctx.rank * 10 + 1}, gathered(2 * n, -1), expected;
          for (int r = 0; r < ctx.size; ++r) expected.insert(expected.end(), {r * 10, r * 10 + 1});
          OpSpec allgather = cuda_spec(allreduce_spec(DDL_INT64, 2));
          allgather.kind = OpKind::Allgather;
          succeeded(ctx.engine->submit("gather", allgather, mine.data(), gathered.data()), "gather");
          CHECK(gathered == expected);

          // A reducescatter of unequal blocks (rank r gets r + 1 elements), which NCCL cannot do.
          OpSpec scatter = cuda_spec(allreduce_spec(DDL_FLOAT32, 0));
          scatter.kind = OpKind::Reducescatter;
          for (int r = 0; r < ctx.size; ++r) scatter.counts.push_back(static_cast<uint64_t>(r + 1));
          for (uint64_t c : scatter.counts) scatter.count += c;
          std::vector<float> whole(scatter.count);
          for (size_t j = 0; j < whole.size(); ++j) whole[j] = static_cast<float>(j + static_cast<size_t>(ctx.rank));
          std::vector<float> block(static_cast<size_t>(ctx.rank + 1), -1), block_expected;
          const size_t offset = static_cast<size_t>(ctx.rank * (ctx.rank + 1) / 2);
          for (size_t j = 0; j < block.size(); ++j)
            block_expected.push_back(static_cast<float>(ctx.size) * static_cast<float>(offset + j) +
                                     static_cast<float>(ctx.size * (ctx.size - 1) / 2));
          succeeded(ctx.engine->submit("scatter", scatter, whole.data(), block.data()), "scatter");
          CHECK(block == block_expected);

          // An alltoallv: rank r sends r + 1 elements to each rank, valued sender * 100 + destination.
          OpSpec alltoallv = cuda_spec(allreduce_spec(DDL_INT32, 0));
          alltoallv.kind = OpKind::Alltoallv;
          std::vector<size_t> send_counts(n, static_cast<size_t>(ctx.rank + 1)), recv_counts;
          std::vector<int32_t> to_send, received, received_expected;
          for (int d = 0; d < ctx.size; ++d) to_send.insert(to_send.end(), static_cast<size_t>(ctx.rank + 1), ctx.rank * 100 + d);
          for (int s = 0; s < ctx.size; ++s) {
            recv_counts.push_back(static_cast<size_t>(s + 1));
            received_expected.insert(received_expected.end(), static_cast<size_t>(s + 1), s * 100 + ctx.rank);
          }
          received.assign(received_expected.size(), -1);
          succeeded(ctx.engine->submit_with_counts("swap", alltoallv, to_send.data(), received.data(), send_counts, recv_counts), "swap");
          CHECK(received == received_expected);

          // Rank 0's copy of an input fails: the op fails on every rank, naming rank 0 and the copy
          // (its peers would otherwise have summed zeros in rank 0's place); the next op is right.
          ctx.sync();
          if (ctx.rank == 0) memory.refuse_next_copy_to_host = true;
          float x = 1, y = -1;
          Outcome refused = outcome(ctx.engine->submit("refused", cuda_spec(allreduce_spec(DDL_FLOAT32, 1)), &x, &y));
          CHECK(refused.status == DDL_ERROR_INTERNAL);
          CHECK(refused.message == "op 'refused': rank 0 could not copy its CUDA buffer to the host: the test refused this copy");
          CHECK(y == -1);
          y = -1;
          succeeded(ctx.engine->submit("after", cuda_spec(allreduce_spec(DDL_FLOAT32, 1)), &x, &y), "after");
          CHECK(y == static_cast<float>(ctx.size));
        });
      }
    }
  }

  TEST_CASE("CUDA allreduces fuse: one NCCL reduction per fusion buffer and stream, one event per stream, copies outside the group") {
    std::vector<std::shared_ptr<PlayedGpuCounts>> counts(8);
    const WorldOptions options = with_played_gpu(counts);
    for_each_world(options, [&](RankContext& ctx) {
      PlayedGpuCounts& played = *counts.at(static_cast<size_t>(ctx.rank));
      // Sixteen allreduces on one stream, agreed in one round: one reduction of all of them, one event.
      CHECK_WIRE(sixteen_allreduces(ctx, "grad", true), {{16 * 64, 4}});
      CHECK(played.marks == 1);
      // Streams are each rank's own: rank 0 puts every op on one stream, the others alternate two,
      // with a broadcast among them. Every rank fuses alike (one reduction of the eight, from the
      // agreed specs alone), and marks one event per stream it used.
      int stream_a = 0, stream_b = 0;
      auto stream_of = [&](int i) { return ctx.rank == 0 || i % 2 == 0 ? static_cast<void*>(&stream_a) : static_cast<void*>(&stream_b); };
      std::vector<std::vector<float>> in(8), out(8);
      std::vector<int64_t> shared(3, ctx.rank == 0 ? 5 : -1);
      std::vector<std::shared_ptr<OpState>> ops;
      for (int i = 0; i < 8; ++i) {
        for (size_t j = 0; j < 32; ++j) in[i].push_back(input(ctx.rank, i, j));
        out[i].assign(32, -1);
      }
      {
        Paused paused(ctx.probe);
        for (int i = 0; i < 8; ++i) {
          ops.push_back(ctx.engine->submit(fmt::format("two.{}", i), cuda_spec(allreduce_spec(DDL_FLOAT32, 32)), in[i].data(),
                                           out[i].data(), stream_of(i)));
          if (i == 3) {
            OpSpec broadcast = cuda_spec(allreduce_spec(DDL_INT64, 3));
            broadcast.kind = OpKind::Broadcast;
            ops.push_back(ctx.engine->submit("between", broadcast, shared.data(), shared.data(), &stream_a));
          }
        }
      }
      for (auto& op : ops) succeeded(op, "an op on two streams");
      for (int i = 0; i < 8; ++i) {
        bool right = true;
        for (size_t j = 0; j < 32; ++j) right = right && out[i][j] == expected_sum(ctx.size, i, j);
        CHECK_MESSAGE(right, "two.", i, " has a wrong sum");
      }
      CHECK(shared == std::vector<int64_t>(3, 5));
      CHECK_WIRE(ctx.probe.take_allreduces(), {{8 * 32, 4}});
      CHECK(played.marks == (ctx.rank == 0 ? 2 : 3));
      CHECK(played.buffers == 2);
      CHECK(played.buffers_held == 0);
    });
  }

  TEST_CASE("a CUDA allgather or alltoallv whose input shares the output's memory is copied apart first; NCCL's in place is not") {
    std::vector<std::shared_ptr<PlayedGpuCounts>> counts(8);
    const WorldOptions options = with_played_gpu(counts);
    for_each_world(options, [&](RankContext& ctx) {
      PlayedGpuCounts& played = *counts.at(static_cast<size_t>(ctx.rank));
      const auto n = static_cast<size_t>(ctx.size);
      OpSpec allgather = cuda_spec(allreduce_spec(DDL_INT64, 2));
      allgather.kind = OpKind::Allgather;
      std::vector<int64_t> expected;
      for (int r = 0; r < ctx.size; ++r) expected.insert(expected.end(), {r * 10, r * 10 + 1});
      // send == recv: this rank's two elements at the output's start (rank 0's own block: in place).
      std::vector<int64_t> both(2 * n, -1);
      both[0] = ctx.rank * 10;
      both[1] = ctx.rank * 10 + 1;
      succeeded(ctx.engine->submit("gather.same", allgather, both.data(), both.data()), "gather.same");
      CHECK(both == expected);
      const int copied = ctx.rank == 0 ? 0 : 1;
      CHECK(played.buffers == copied);
      // NCCL's in place: the input is this rank's own block of the output.
      std::vector<int64_t> own(2 * n, -1);
      own[2 * static_cast<size_t>(ctx.rank)] = ctx.rank * 10;
      own[2 * static_cast<size_t>(ctx.rank) + 1] = ctx.rank * 10 + 1;
      succeeded(ctx.engine->submit("gather.own", allgather, own.data() + 2 * ctx.rank, own.data()), "gather.own");
      CHECK(own == expected);
      CHECK(played.buffers == copied);
      // An alltoallv in place, three elements to each rank: sender * 100 + destination * 10 + k.
      OpSpec alltoallv = cuda_spec(allreduce_spec(DDL_INT32, 0));
      alltoallv.kind = OpKind::Alltoallv;
      std::vector<int32_t> blocks, blocks_expected;
      for (int d = 0; d < ctx.size; ++d)
        for (int k = 0; k < 3; ++k) {
          blocks.push_back(ctx.rank * 100 + d * 10 + k);
          blocks_expected.push_back(d * 100 + ctx.rank * 10 + k);
        }
      const std::vector<size_t> three(n, 3);
      succeeded(ctx.engine->submit_with_counts("swap.same", alltoallv, blocks.data(), blocks.data(), three, three), "swap.same");
      CHECK(blocks == blocks_expected);
      CHECK(played.buffers == copied + 1);
      CHECK(played.buffers_held == 0);
    });
  }

  TEST_CASE("a CUDA allreduce alone is not copied: NCCL reduces it where it lies; DDL_FUSION_THRESHOLD=0 fuses nothing") {
    std::vector<std::shared_ptr<PlayedGpuCounts>> counts(8);
    for (const size_t threshold : {size_t{0}, size_t{64} << 20}) {
      WorldOptions options;
      options.config = [&](int rank) {
        EngineConfig c;
        c.fusion_threshold = threshold;
        auto mine = counts.at(static_cast<size_t>(rank)) = std::make_shared<PlayedGpuCounts>();
        c.gpu_collectives = [mine](Collectives& host) { return std::make_unique<HostPlayedGpu>(host, mine); };
        return c;
      };
      for_each_world(options, [&](RankContext& ctx) {
        PlayedGpuCounts& played = *counts.at(static_cast<size_t>(ctx.rank));
        if (threshold == 0) CHECK_WIRE(sixteen_allreduces(ctx, "unfused", true), std::vector<WireAllreduce>(16, {64, 4}));
        std::vector<float> x(5, static_cast<float>(ctx.rank + 1)), y(5, -1);
        succeeded(ctx.engine->submit("alone", cuda_spec(allreduce_spec(DDL_FLOAT32, 5)), x.data(), y.data()), "alone");
        CHECK(y == std::vector<float>(5, static_cast<float>(ctx.size * (ctx.size + 1) / 2)));
        CHECK(played.buffers == 0);
      });
    }
  }

}  // TEST_SUITE
