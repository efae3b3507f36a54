#include "runtime/src/engine/engine.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"
#include "runtime/src/core/copy_bytes.hpp"
#include "runtime/src/core/dtype.hpp"

namespace ddl::runtime {

bool OpState::settle(ddl_status status, std::string message) {
  std::lock_guard lock(mutex_);
  if (done_) return false;
  done_ = true;
  status_ = status;
  message_ = std::move(message);
  return true;
}

ddl_status OpState::wait(std::string& message) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  message = message_;
  return status_;
}

bool OpState::done() {
  std::lock_guard lock(mutex_);
  return done_;
}

namespace {

// Copies `count` elements into the fusion buffer, converting float32 to float16 when compressing.
void pack_into(const void* from, char* to, size_t count, ddl_dtype dtype, bool compress) {
  if (!compress) {
    copy_bytes(to, from, count * dtype_size(dtype));
    return;
  }
  const auto* f = static_cast<const float*>(from);
  auto* h = reinterpret_cast<unsigned short*>(to);
  for (size_t i = 0; i < count; ++i) h[i] = float_to_half(f[i]);
}

void unpack_from(const char* from, void* to, size_t count, ddl_dtype dtype, bool compress) {
  if (!compress) {
    copy_bytes(to, from, count * dtype_size(dtype));
    return;
  }
  const auto* h = reinterpret_cast<const unsigned short*>(from);
  auto* f = static_cast<float*>(to);
  for (size_t i = 0; i < count; ++i) f[i] = half_to_float(h[i]);
}

}  // namespace

Engine::Engine(std::unique_ptr<Collectives> collectives, EngineConfig config)
    : collectives_(std::move(collectives)),
      config_(std::move(config)),
      rank_(collectives_->rank()),
      size_(collectives_->size()),
      negotiator_(size_),
      timeline_(config_.timeline ? config_.timeline : std::make_shared<Timeline>(config_.timeline_path, rank_)),
      progress_(config_.progress_path) {
  if (!config_.world_ranks.empty()) negotiator_.name_ranks_by(config_.world_ranks);
  if (config_.report_stragglers && config_.world_ranks.empty() && rank_ == 0) {  // rank 0 alone reports
    stragglers_ = std::make_unique<StragglerTally>(size_);
    negotiator_.count_stragglers(stragglers_.get());
    next_straggler_report_ = Clock::now() + config_.straggler_interval;
  }
  // Which ops fuse decides which collectives run, so every rank must use the same threshold: rank
  // 0's. Rank 0's clock decides which ops stalled, so its timeout is every rank's too.
  uint64_t agreed[2] = {config_.fusion_threshold, static_cast<uint64_t>(config_.timeout.count())};
  collectives_->broadcast(agreed, sizeof agreed, 0);
  config_.fusion_threshold = static_cast<size_t>(agreed[0]);
  config_.timeout = std::chrono::milliseconds(static_cast<long long>(agreed[1]));
  negotiator_.say_timeout(config_.timeout, config_.timeout_setting);
  last_round_ = Clock::now().time_since_epoch().count();  // the broadcast above: the first cycle counts from here
  thread_ = std::thread([this] { run_loop(); });
}

Engine::~Engine() { finalize(); }

std::shared_ptr<OpState> Engine::submit(std::string name, OpSpec spec, const void* send, void* recv, void* stream) {
  return enqueue({std::move(name), std::move(spec), send, recv, nullptr, Clock::now(), stream});
}

std::shared_ptr<OpState> Engine::submit_with_counts(std::string name, OpSpec spec, const void* send, void* recv,
                                                    std::vector<size_t> send_counts, std::vector<size_t> recv_counts, void* stream) {
  PendingOp op{std::move(name), std::move(spec), send, recv, nullptr, Clock::now(), stream};
  op.send_counts = std::move(send_counts);
  op.recv_counts = std::move(recv_counts);
  return enqueue(std::move(op));
}

std::shared_ptr<OpState> Engine::enqueue(PendingOp op) {
  auto state = std::make_shared<OpState>();
  op.state = state;
  std::unique_lock lock(mutex_);
  if (op.name.empty()) {
    op.name = next_unnamed_name();
    op.spec.ordered = true;
  }
  if (auto refusal = refusal_of(op.name, op.spec)) {
    state->refuse(refusal->first, std::move(refusal->second));
    return state;
  }
  add_to_inbox(std::move(op));
  lock.unlock();
  wake_.notify_all();  // the engine thread, or a caller in run() pausing between its rounds
  return state;
}

// A spare node keeps its last op's name and vectors until it is filled again: only small ones are kept
// (a gradient's), not an alltoallv's counts for a thousand ranks.
bool Engine::worth_keeping(const PendingOp& op) {
  const size_t elements = op.spec.counts.capacity() + op.spec.shape.capacity() + op.send_counts.capacity() + op.recv_counts.capacity();
  return elements <= 64 && op.name.capacity() <= 256;
}

void Engine::add_to_inbox(PendingOp op) {
  inbox_bytes_ += bytes_of(op.spec);
  if (spare_nodes_.empty()) {
    std::string name = op.name;
    inbox_order_.push_back(&inbox_.try_emplace(std::move(name), std::move(op)).first->second);
    return;
  }
  OpTable::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.key() = op.name;  // a copy into the key's room
  node.mapped() = std::move(op);
  inbox_order_.push_back(&inbox_.insert(std::move(node)).position->second);
}

std::string Engine::unnamed_name(uint64_t index) { return fmt::format("unnamed.{}", index); }
std::string Engine::next_unnamed_name() { return unnamed_name(unnamed_counter_++); }

std::optional<std::pair<ddl_status, std::string>> Engine::refusal_of(const std::string& name, const OpSpec& spec) const {
  if (broken_) return std::pair{broken_status_, broken_message_};
  if (spec.ordered && order_broken_) {
    FailedOp refused = out_of_order_failure(name, *order_broken_);
    return std::pair{refused.status, std::move(refused.message)};
  }
  if (finalize_requested_) return std::pair{DDL_ERROR_NOT_INITIALIZED, fmt::format("op '{}' submitted after ddl_finalize", name)};
  if (in_flight_.count(name) || inbox_.count(name) || is_proposed(name))
    return std::pair{DDL_ERROR_INVALID_ARGUMENT, in_flight_message(name)};
  return std::nullopt;
}

bool Engine::is_proposed(const std::string& name) const {
  if (!proposing_) return false;
  if (!proposing_->unnamed_index) return name == *proposing_->name;
  // "unnamed.N" without making the string (a caller may pass that name explicitly)
  constexpr std::string_view prefix = "unnamed.";
  return name.starts_with(prefix) && name.compare(prefix.size(), std::string::npos, std::to_string(*proposing_->unnamed_index)) == 0;
}

std::string Engine::in_flight_message(const std::string& name) const {
  return fmt::format("op '{}' is already in flight on rank {}: names must be unique until the op finishes", name, rank_);
}

void Engine::request_finalize() {
  {
    std::lock_guard lock(mutex_);
    if (!finalize_requested_) finalize_requested_at_ = Clock::now();
    finalize_requested_ = true;
  }
  wake_.notify_all();
}

std::pair<ddl_status, std::string> Engine::finalize() {
  request_finalize();
  if (thread_.joinable()) thread_.join();
  write_straggler_report(true);
  // The engine thread leaves only once the rounds have stopped, so nothing records any more. A
  // process set's engine leaves the world's timeline open.
  if (!config_.timeline) timeline_->close();
  return finalize_failure_;
}

void Engine::run_loop() {
  for (;;) {
    const Wake wake = sleep_until_due();
    std::lock_guard round_lock(round_mutex_);
    engine_thread_takes_.fetch_add(1, std::memory_order_relaxed);  // before the mark: see take_round_for_caller
    const RoundHolderMark holder(round_holder_, RoundHolder::EngineThread);
    if (stopped_) return;
    if (wake == Wake::PollGpu) {
      run_guarded([this] {
        poll_gpu_between_rounds();
        return true;
      });
      continue;
    }
    // While this thread waited for the round, a caller of a blocking op may have run the round it
    // woke for: an idle round now would only make the peers' next proposal miss.
    if (!round_due()) continue;
    run_guarded([this] { return round(); });
  }
}

template <typename Body>
void Engine::run_guarded(Body body) {
  try {
    if (body()) return;
    // Every rank finalized: whatever is still waiting for a peer will never run.
    std::lock_guard lock(mutex_);
    for (auto& [name, op] : in_flight_)
      op.state->complete(DDL_ERROR_NOT_INITIALIZED,
                         fmt::format("op '{}' was still waiting for other ranks when every rank finalized", name));
    in_flight_.clear();
  } catch (const TimeoutError& e) {
    fail_after_transport_error(DDL_ERROR_TIMEOUT,
                               with_finalizing_peers(fmt::format("rank {}: timed out talking to the other ranks: {}", rank_, e.what())));
  } catch (const std::exception& e) {  // PeerLostError, and anything else that broke the transport
    fail_after_transport_error(DDL_ERROR_PEER_FAILED,
                               with_finalizing_peers(fmt::format("rank {}: lost a peer talking to the other ranks: {}", rank_, e.what())));
  }
  stopped_ = true;
  std::lock_guard lock(mutex_);
  if (finalize_requested_ && finalize_failure_.first == DDL_SUCCESS && broken_) finalize_failure_ = {broken_status_, broken_message_};
}

void Engine::note_finalizing_peers(const std::vector<Announcement>& round) {
  std::vector<int> finalizing;
  for (size_t r = 0; r < round.size(); ++r)
    if (round[r].finalizing && static_cast<int>(r) != rank_)
      finalizing.push_back(config_.world_ranks.empty() ? static_cast<int>(r) : config_.world_ranks[r]);
  if (finalizing.empty() && finalizing_peers_.empty()) return;  // every round's case: no lock taken
  std::lock_guard lock(mutex_);
  finalizing_peers_ = std::move(finalizing);
}

// A rank that asked to finalize waits for the others at most the engine's timeout, as any wait for
// a peer does: a peer stuck in its own code, or that never finalizes, must not hold it for ever.
bool Engine::leave_overdue_finalize(const std::vector<Announcement>& round) {
  if (!finalize_requested_.load(std::memory_order_relaxed)) return false;  // every round's case: no lock taken
  {
    std::lock_guard lock(mutex_);
    if (Clock::now() - finalize_requested_at_ < config_.timeout) return false;
  }
  std::vector<int> missing;
  for (size_t r = 0; r < round.size(); ++r)
    if (!round[r].finalizing) missing.push_back(config_.world_ranks.empty() ? static_cast<int>(r) : config_.world_ranks[r]);
  const std::string message =
      fmt::format("rank {} left without rank(s) {}: they had not finalized within {} s ({})", rank_, fmt::join(missing, ","),
                  std::chrono::duration<double>(config_.timeout).count(), config_.timeout_setting);
  fail_after_transport_error(DDL_ERROR_TIMEOUT, message);
  finalize_failure_ = {DDL_ERROR_TIMEOUT, message};
  return true;
}

std::string Engine::with_finalizing_peers(std::string message) {
  std::lock_guard lock(mutex_);
  if (!finalizing_peers_.empty())
    message += fmt::format(
        " (rank(s) {} had called ddl_finalize (Python: shutdown()) while this rank still ran ops; a rank that "
        "finalizes waits for the others at most {} s ({}), then leaves)",
        fmt::join(finalizing_peers_, ","), std::chrono::duration<double>(config_.timeout).count(), config_.timeout_setting);
  return message;
}

void Engine::fail_after_transport_error(ddl_status status, const std::string& message) {
  if (gpu_) gpu_->abort();  // nothing may stay blocked on the GPU for a peer that is gone
  fail_everything(status, message);
}

// Sleep one cycle unless there is work; a submit wakes the thread early. A rank whose ops wait for
// its peers does not sleep: the next round's allgather waits for them anyway, and a peer that
// submits wakes at once, so the op runs in the round right after the last submit. After a stretch
// of idle rounds (no op anywhere for ~100 cycles) the sleep grows to 16 cycles, so an idle world
// does not keep the cores busy while a busy one keeps its latency.
//
// A rank that has waited for its peers for a while with nobody doing anything (a gradient hook's
// op submitted, the other ranks still in backward) sleeps too, an eighth of how long nothing has
// happened: otherwise the engines of all ranks go round in lockstep, each taking a core from the
// compute that would submit the awaited ops. The delay this adds to the op is at most an eighth of
// what it already waited; a submit here still wakes the thread at once.
//
// In the steady state (see steady_) ops are not announced as they come: the thread runs its next
// round one cycle after the last, and that round announces every op submitted meanwhile, by cache
// id, so that a backward pass's gradients cost a round per cycle, not one each, and the ops agreed
// together fuse. Ops enough for a collective of their own (kEagerRoundBytes) go at once: a burst
// of submissions is then reduced in pieces while the rest still comes, as without the pace.
// CUDA ops in flight are polled every 50 µs meanwhile, without a round. A caller
// waiting for an op runs the rounds itself at once (run_rounds_until_done), so the pace delays
// what nobody waits for yet; DDL_CYCLE_TIME_MS=0 turns it off.
//
// The cycle counts from the last round this rank ran, whoever ran it: while callers run their own
// rounds (blocking ops in a loop), an idle round of the engine thread would only stand in the way
// of their next one (it holds the round and makes a peer's proposal miss).
Engine::Wake Engine::sleep_until_due() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (paced()) {
      const Clock::time_point due = paced_round_due();
      const Clock::time_point now = Clock::now();
      if (now >= due) return Wake::Round;
      if (!gpu_busy_) {
        wake_.wait_until(lock, due);
        continue;
      }
      wake_.wait_until(lock, std::min(due, now + kGpuPollInterval));
      return Clock::now() >= paced_round_due() ? Wake::Round : Wake::PollGpu;
    }
    if (has_news()) return Wake::Round;
    if (waiting_for_peers()) {
      if (auto pause = waiting_backoff(Clock::now()); pause.count() > 0) wake_.wait_for(lock, pause);
      return Wake::Round;
    }
    const Clock::time_point due = idle_round_due();
    if (Clock::now() >= due) return Wake::Round;
    wake_.wait_until(lock, due);
  }
}

Engine::Clock::time_point Engine::idle_round_due() const {
  const int cycles = idle_rounds_ < kIdleRoundsBeforeBackoff ? 1 : 16;
  return Clock::time_point(Clock::duration(last_round_.load(std::memory_order_relaxed))) + config_.cycle_time * cycles;
}

Engine::Clock::time_point Engine::paced_round_due() const {
  return Clock::time_point(Clock::duration(last_round_.load(std::memory_order_relaxed))) + config_.cycle_time;
}

// sleep_until_due's reasons, asked again once the engine thread holds the round.
bool Engine::round_due() {
  std::lock_guard lock(mutex_);
  if (paced()) return Clock::now() >= paced_round_due();
  return has_news() || waiting_for_peers() || Clock::now() >= idle_round_due();
}

void Engine::poll_gpu_between_rounds() {
  poll_gpu_ops();
  std::lock_guard lock(mutex_);
  gpu_busy_ = !gpu_in_flight_.empty();
}

bool Engine::has_news() const { return !inbox_.empty() || finalize_requested_; }
bool Engine::waiting_for_peers() const { return !in_flight_.empty() || gpu_busy_; }

void Engine::pause_between_rounds() {
  std::unique_lock lock(mutex_);
  if (has_news()) return;
  if (auto pause = waiting_backoff(Clock::now()); pause.count() > 0) wake_.wait_for(lock, pause);
}

bool Engine::round() {
  Announcement mine;
  {
    std::lock_guard lock(mutex_);
    for (PendingOp* op : inbox_order_) {
      // refusal_of keeps a name in one place at a time (inbox, proposal or in flight), so this
      // insert always takes the node; should it not, the op fails rather than vanish.
      auto placed = in_flight_.insert(inbox_.extract(op->name));
      if (!placed.inserted) {
        op->state->complete(DDL_ERROR_INVALID_ARGUMENT, in_flight_message(op->name));
        continue;
      }
      if (op->spec.kind == OpKind::Join) joined_ = true;
      if (auto id = negotiator_.cached_id(op->name, op->spec))
        mine.cached.push_back(*id);
      else
        mine.submitted.emplace_back(op->name, op->spec);
    }
    // in_flight_ changes only here, in run() and in finish(), all under the lock; the thread running
    // rounds reads it freely.
    if (!mine.submitted.empty() || !mine.cached.empty()) steady_ = mine.submitted.empty();
    inbox_order_.clear();
    inbox_bytes_ = 0;
    // A rank with CUDA ops still running is not done yet; announcing that (rather than each rank
    // checking its own) keeps every rank leaving the loop in the same round.
    mine.finalizing = finalize_requested_ && gpu_in_flight_.empty();
    mine.joined = joined_;
  }
  if (rank_ == 0) mine.expired = negotiator_.stalled(Clock::now(), config_.timeout);

  std::vector<Announcement> round;
  for (const auto& bytes : collectives_->allgather_bytes(mine.serialize())) round.push_back(Announcement::parse(bytes));
  return complete_round(round);
}

bool Engine::complete_round(const std::vector<Announcement>& round) {
  RoundDecision decision = negotiator_.merge(round, Clock::now());
  note_finalizing_peers(round);
  if (!decision.all_finalizing && leave_overdue_finalize(round)) return false;
  if (negotiator_.order_broken()) {  // before the failed ops' waiters wake: their next ordered op is refused at submit
    std::lock_guard lock(mutex_);
    order_broken_ = negotiator_.order_broken();
  }
  for (const auto& failed : decision.failed) {
    if (failed.only_rank >= 0 && failed.only_rank != rank_) continue;
    auto it = in_flight_.find(failed.name);
    if (it != in_flight_.end()) finish(it->second, failed.status, failed.message);
  }
  const bool nothing_announced =
      std::all_of(round.begin(), round.end(), [](const Announcement& a) { return a.submitted.empty() && a.cached.empty(); });
  const bool fruitless = decision.ready.empty() && decision.failed.empty() && nothing_announced;
  execute(decision.ready);
  poll_gpu_ops();
  {
    std::lock_guard lock(mutex_);
    idle_rounds_ = fruitless && in_flight_.empty() && gpu_in_flight_.empty() ? idle_rounds_ + 1 : 0;
    if (!fruitless) last_progress_ = Clock::now();
    gpu_busy_ = !gpu_in_flight_.empty();
  }
  last_round_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  if (stragglers_ && config_.straggler_interval.count() > 0 && Clock::now() >= next_straggler_report_) write_straggler_report(false);
  return !(decision.all_finalizing && decision.ready.empty());
}

void Engine::report_stragglers_at_exit() { write_straggler_report(true); }

// Rank 0's word only (every rank's rounds are the same). The tally has a lock of its own: at exit,
// the engine thread may be in a round, waiting for peers that are gone.
void Engine::write_straggler_report(bool final) {
  if (!stragglers_ || stragglers_reported_.load()) return;
  if (final && stragglers_reported_.exchange(true)) return;
  if (!final) next_straggler_report_ = Clock::now() + config_.straggler_interval;  // (read by rounds alone)
  const std::string text = stragglers_->report(config_.rank_hosts);
  if (!text.empty()) std::fprintf(stderr, "ddl: %s%s\n", final ? "" : "so far, ", text.c_str());
}

bool Engine::proposable(const OpSpec& spec) {
  if (spec.cuda || spec.compress_fp16) return false;
  return spec.kind == OpKind::Allreduce || spec.kind == OpKind::Broadcast || spec.kind == OpKind::Barrier;
}

ddl_status Engine::run(std::string name, OpSpec spec, const void* send, void* recv, std::string& message, void* stream) {
  std::unique_lock round_lock = take_round_for_caller();
  if (!round_lock.owns_lock()) return submit(std::move(name), std::move(spec), send, recv, stream)->wait(message);
  const RoundHolderMark holder(round_holder_, RoundHolder::Caller);
  PendingOp op{std::move(name), std::move(spec), send, recv, nullptr, Clock::now(), stream};
  Offer offer;  // the op, proposed to run in its own round
  std::shared_ptr<OpState> state;
  {
    std::lock_guard lock(mutex_);
    // An unnamed op is named only when something needs the name: a proposal that runs needs none.
    if (op.name.empty()) {
      offer.unnamed_index = unnamed_counter_++;
      op.spec.ordered = true;
    }
    // Only a rank with nothing in flight proposes, and only while no op waits anywhere (so all
    // ranks' negotiators are idle and stay alike when the op runs without them). Its name cannot be
    // in flight then, so only a broken or finalizing engine refuses it: that one proposes nothing.
    if (!broken_ && !finalize_requested_ && !stopped_ && !(op.spec.ordered && order_broken_) && inbox_.empty() && in_flight_.empty() &&
        gpu_in_flight_.empty() && !joined_ && negotiator_.idle() && proposable(op.spec)) {
      if (offer.unnamed_index) {
        offer.proposal = Proposal::for_unnamed(op.spec, *offer.unnamed_index);
      } else if (auto id = negotiator_.cached_id(op.name, op.spec)) {
        offer.proposal = Proposal::for_cached(op.spec, *id);
        offer.cache_id = *id;
      }
    }
    if (offer.proposal.empty()) {  // the caller's first round below takes it from the inbox
      name_if_unnamed(op, offer);
      if (auto refusal = refusal_of(op.name, op.spec)) {
        message = std::move(refusal->second);
        return refusal->first;
      }
      state = op.state = std::make_shared<OpState>();
      add_to_inbox(std::move(op));
    } else {
      proposing_ = Proposing{&op.name, offer.unnamed_index};  // its name is taken from now on (refusal_of)
    }
  }
  if (!offer.proposal.empty()) {
    std::optional<ddl_status> ran = run_proposed(op, offer, message);
    {
      std::lock_guard lock(mutex_);
      proposing_.reset();  // done, or in flight now: in_flight_ holds the name
    }
    if (ran) return *ran;
    state = op.state;  // announced in that round like any op; the rounds below run it
  }
  rounds_until_done(*state);
  return state->wait(message);
}

void Engine::rounds_until_done(OpState& state) {
  while (!state.done() && !stopped_) {
    pause_between_rounds();
    run_guarded([this] { return round(); });
  }
}

void Engine::run_rounds_until_done(OpState& state) {
  if (state.done()) return;
  std::unique_lock round_lock = take_round_for_caller(&state);
  if (!round_lock.owns_lock()) return;
  const RoundHolderMark holder(round_holder_, RoundHolder::Caller);
  rounds_until_done(state);
}

void Engine::name_if_unnamed(PendingOp& op, const Offer& offer) {
  if (op.name.empty() && offer.unnamed_index) op.name = unnamed_name(*offer.unnamed_index);
}

// The round for a caller of a blocking op, or none while another caller runs rounds: that caller
// may wait for peers that wait for this op (two threads of each rank running blocking ops in
// different orders), so this op goes to its next round, as submit() hands it over. The engine
// thread's round, which ends without this op, is waited for: otherwise every op the engine thread
// finishes would make the caller's next op miss the fast path (the caller wakes while the engine
// thread still closes the round). Should the engine thread go straight on to another round (ops
// of its own waiting for peers), the op is handed to that one.
//
// A waiting caller (wait()) stops as soon as its op is done, and polls by yielding only: should the
// engine thread's round last (a peer not there yet), the op is left to it and waited for.
std::unique_lock<std::mutex> Engine::take_round_for_caller(OpState* awaited) {
  std::unique_lock lock(round_mutex_, std::try_to_lock);
  std::optional<uint64_t> engine_round;  // the engine thread's round being waited for
  // Polled (a round usually ends within microseconds): a timed lock would do, but ThreadSanitizer
  // 14 does not see pthread_mutex_clocklock, under std::timed_mutex.
  for (int polls = 0; !lock.owns_lock(); ++polls) {
    if (awaited != nullptr && (polls >= kYieldingPolls || awaited->done())) break;
    const RoundHolder holder = round_holder_.load(std::memory_order_acquire);
    if (holder == RoundHolder::Caller) break;
    if (holder == RoundHolder::EngineThread) {
      const uint64_t takes = engine_thread_takes_.load(std::memory_order_relaxed);
      if (engine_round && *engine_round != takes) break;
      engine_round = takes;
    }
    if (polls < kYieldingPolls)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    (void)lock.try_lock();
  }
  return lock;
}

std::optional<ddl_status> Engine::run_proposed(PendingOp& op, const Offer& offer, std::string& message) {
  const OpSpec& s = op.spec;
  const size_t element = dtype_size(s.dtype);
  ProposedOp proposed{offer.proposal, s.kind, op.send, op.recv, s.count * element, element, nullptr, s.root};
  if (s.kind == OpKind::Allreduce) {
    proposed.reduce = reduce_function(s.dtype, s.reduce);
    if (s.prescale != 1.0) {  // scaled in a copy: the input stays as it was if the op goes on as any other
      if (scratch_.size() < s.count * element) scratch_.resize(s.count * element);
      copy_bytes(scratch_.data(), op.send, s.count * element);
      scale(scratch_.data(), s.count, s.dtype, s.prescale);
      proposed.send = scratch_.data();
    }
  }
  // This rank's announcement of the op, made only if the transport needs it.
  const std::function<std::string()> announce = [&] {
    Announcement mine;
    mine.proposal = offer.proposal;
    if (offer.unnamed_index) {
      name_if_unnamed(op, offer);
      mine.submitted.emplace_back(op.name, s);
    } else {
      mine.cached.push_back(offer.cache_id);
    }
    return mine.serialize();
  };
  const bool timed = timeline_->enabled();
  const auto started = timed ? Clock::now() : op.submitted;
  std::optional<ddl_status> outcome;
  run_guarded([&] {
    std::vector<std::string> raw;
    using Outcome = Collectives::ProposalOutcome;
    const Outcome gathered = collectives_->allgather_bytes_proposing(announce, proposed, raw);
    std::vector<Announcement> round;
    bool agreed = gathered == Outcome::Agreed;  // by every rank, and left to the engine to run
    if (gathered == Outcome::Announced) {
      for (const auto& bytes : raw) round.push_back(Announcement::parse(bytes));
      agreed = std::all_of(round.begin(), round.end(), [&](const Announcement& a) { return a.proposal == offer.proposal; });
    }
    if (agreed) run_agreed(proposed);
    if (agreed || gathered == Outcome::Ran) {
      negotiator_.ran_without_round(started);
      last_round_.store(started.time_since_epoch().count(), std::memory_order_relaxed);
      if (s.kind == OpKind::Allreduce) {
        finish_reduction(op.recv, s.count, s);
      }
      if (timed) {
        name_if_unnamed(op, offer);
        record(op.name, "NEGOTIATE", op.submitted, started);
        record(op.name, op_kind_name(s.kind), started, Clock::now());
      }
      progress_.note();
      outcome = DDL_SUCCESS;
      return true;
    }
    // Not every rank proposed it: the round announced it like any other op.
    name_if_unnamed(op, offer);
    op.state = std::make_shared<OpState>();
    {
      std::lock_guard lock(mutex_);
      std::string name = op.name;
      in_flight_.emplace(std::move(name), op);
    }
    return complete_round(round);
  });
  if (!outcome && stopped_ && op.state == nullptr) {  // the transport broke in the proposal's round
    std::lock_guard lock(mutex_);
    message = broken_message_;
    return broken_status_;
  }
  return outcome;
}

// The transport gathered the proposals without running the op: every rank runs it now, alike.
void Engine::run_agreed(const ProposedOp& op) {
  switch (op.kind) {
    case OpKind::Allreduce:
      if (op.send != op.recv) move_bytes(op.recv, op.send, op.bytes);
      collectives_->allreduce(op.recv, op.bytes, op.element_size, op.reduce);
      break;
    case OpKind::Broadcast: collectives_->broadcast(op.recv, op.bytes, op.root); break;
    default: break;  // a barrier: gathering every rank's announcement was one
  }
}

// Zero while the last progress is recent (peers are usually microseconds behind); then an eighth
// of the time since, at most one cycle (mutex_ held). CUDA ops in flight cap it at kGpuPollInterval.
std::chrono::microseconds Engine::waiting_backoff(Clock::time_point now) const {
  using std::chrono::microseconds;
  const auto quiet = std::chrono::duration_cast<microseconds>(now - last_progress_);
  if (quiet < kQuietBeforeBackoff) return microseconds(0);
  auto pause = std::min(quiet / 8, std::chrono::duration_cast<microseconds>(config_.cycle_time));
  if (gpu_busy_) pause = std::min(pause, kGpuPollInterval);
  return pause;
}

size_t Engine::bytes_of(const OpSpec& spec) const { return spec.count * dtype_size(spec.dtype); }

void Engine::execute(const std::vector<ReadyOp>& ready) {
  const auto negotiated = Clock::now();
  std::vector<PendingOp*> ops;
  stand_ins_.clear();
  for (const auto& r : ready) {
    auto found = in_flight_.find(r.name());
    // Every rank submitted it, this one included, unless this rank waits in join.
    PendingOp& op = found != in_flight_.end() ? found->second : stand_in_for(r);
    if (r.spec().kind == OpKind::Join) op.join_result = r.last_joined;
    record(op.name, "NEGOTIATE", op.submitted, negotiated);
    op.agreed = negotiated;
    ops.push_back(&op);
  }
  route_cuda_ops(ops);
  // Host allreduces of one dtype and reduction are fused (and CUDA ones staged in host memory); CUDA
  // ops are launched as one NCCL group; everything else runs in the agreed order.
  std::vector<PendingOp*> allreduces;
  std::vector<PendingOp*> gpu_ops;
  for (PendingOp* op : ops) {
    if (op->spec.cuda && !op->staged)
      gpu_ops.push_back(op);
    else if (op->spec.kind == OpKind::Allreduce)
      allreduces.push_back(op);
    else
      run_single(*op);
  }
  run_allreduces(allreduces);
  enqueue_gpu_ops(std::move(gpu_ops));
}

// CUDA ops in `ops` either stay for NCCL, or are staged in host memory (and then run as host ops
// do), or fail (no route, or a rank could not copy its input to the host): then they leave `ops`
// before they are finished (finish() may free them).
// (A rank in ddl_join stands in for no CUDA op: the negotiator fails those, so every CUDA op here
// was submitted on this rank.)
void Engine::route_cuda_ops(std::vector<PendingOp*>& ops) {
  std::vector<PendingOp*> cuda_ops;
  for (PendingOp* op : ops)
    if (op->spec.cuda) cuda_ops.push_back(op);
  if (cuda_ops.empty()) return;
  std::optional<NoCudaRoute> no_route = choose_cuda_route(cuda_ops);
  if (!no_route && cuda_via_host_) {
    for (PendingOp* op : cuda_ops) stage_on_host(*op);
    no_route = copies_to_host_failed(cuda_ops);
  }
  if (!no_route) return;
  std::erase_if(ops, [](const PendingOp* op) { return op->spec.cuda; });
  for (PendingOp* op : cuda_ops) {
    op->staging_error.clear();  // every rank fails them alike, naming the rank whose copy failed
    finish(*op, no_route->status, fmt::format("op '{}': {}", op->name, no_route->why));
  }
}

// Every rank says whether it could copy this round's CUDA inputs to the host (one allgather): a rank
// that could not would put zeros in its peers' results (a broadcast root's, an allgather's block),
// so the round's CUDA ops fail on every rank, naming it.
std::optional<Engine::NoCudaRoute> Engine::copies_to_host_failed(const std::vector<PendingOp*>& cuda_ops) {
  std::string mine = "C";  // not an announcement: a mark that tells it from one in a transport's trace
  for (PendingOp* op : cuda_ops)
    if (!op->staging_error.empty()) {
      mine += op->staging_error;
      break;
    }
  const std::vector<std::string> all = collectives_->allgather_bytes(mine);
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].size() > 1)
      return NoCudaRoute{DDL_ERROR_INTERNAL, fmt::format("rank {} could not copy its CUDA buffer to the host: {}", r, all[r].substr(1))};
  return std::nullopt;
}

// On the first CUDA op: the route every rank agrees on (nullopt), or why there is none.
std::optional<Engine::NoCudaRoute> Engine::choose_cuda_route(const std::vector<PendingOp*>& cuda_ops) {
  if (gpu_ || cuda_via_host_) return std::nullopt;
  if (config_.gpu_collectives) {
    gpu_ = config_.gpu_collectives(*collectives_);
    return std::nullopt;
  }
  try {
    const GpuRouteAsked asked{config_.cuda_via_host, config_.device_memory == nullptr};
    GpuRoute route = agree_on_gpu_route(*collectives_, gpu_buffer_of(cuda_ops), asked);
    if (route.nccl) {
      gpu_ = std::move(route.nccl);
      return std::nullopt;
    }
    if (!config_.device_memory) config_.device_memory = make_cuda_memory();
    cuda_via_host_ = true;
    say_cuda_goes_via_host(route.via_host_because);
    return std::nullopt;
  } catch (const PeerLostError&) {
    throw;  // the transport broke: every op fails (run_guarded)
  } catch (const TimeoutError&) {
    throw;
  } catch (const Error& e) {  // alike on every rank: agree_on_gpu_route and make_cuda_memory decide alike
    return NoCudaRoute{DDL_ERROR_UNSUPPORTED, e.what()};
  }
}

// Once per process, whichever engine (world or process set) decided it first.
void Engine::say_cuda_goes_via_host(const std::string& because) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "ddl: rank %d: CUDA collectives go through host memory over libddl's host transports (%s): correct, but slower than NCCL\n",
               rank_, because.c_str());
}

// The op's input is copied to host memory and its buffers point there; its result goes back to the
// GPU in finish(). A failed copy is noted in the op (copies_to_host_failed then fails the round's
// CUDA ops on every rank). All of a round's inputs are copied before any of its ops runs: ops in
// flight together must not share buffers (as in Horovod).
void Engine::stage_on_host(PendingOp& op) {
  const OpSpec& s = op.spec;
  const size_t element = dtype_size(s.dtype);
  const size_t ranks = static_cast<size_t>(size_);
  size_t in = s.count * element, out = in;
  const void* device_in = op.send;
  bool in_place = true;  // one host buffer serves as input and result
  switch (s.kind) {
    case OpKind::Allreduce: break;
    case OpKind::Broadcast: device_in = op.recv; break;
    case OpKind::Allgather: out = in * ranks, in_place = false; break;
    case OpKind::Reducescatter: out = s.counts[static_cast<size_t>(rank_)] * element, in_place = false; break;
    case OpKind::Alltoallv: {
      size_t sent = 0, received = 0;
      for (size_t c : op.send_counts) sent += c;
      for (size_t c : op.recv_counts) received += c;
      in = sent * element, out = received * element, in_place = false;
      break;
    }
    default: break;  // the C API offers no other CUDA op
  }
  op.staging.assign(in_place ? std::max(in, out) : in + out, 0);
  const auto started = Clock::now();
  try {
    config_.device_memory->to_host(op.staging.data(), device_in, in, op.stream);
  } catch (const std::exception& e) {
    op.staging_error = e.what();
  }
  record(op.name, "MEMCPY_TO_HOST", started, Clock::now());
  op.device_result = op.recv;
  op.device_result_bytes = out;
  op.send = op.staging.data();
  op.recv = op.staging.data() + (in_place ? 0 : in);
  op.staged = true;
}

void Engine::copy_result_to_device(PendingOp& op) {
  if (op.staging_error.empty() && op.device_result != nullptr) {
    const auto started = Clock::now();
    try {
      config_.device_memory->to_device(op.device_result, op.recv, op.device_result_bytes, op.stream);
    } catch (const std::exception& e) {
      op.staging_error = e.what();
    }
    record(op.name, "MEMCPY_TO_DEVICE", started, Clock::now());
  }
  op.device_result = nullptr;
}

void Engine::enqueue_gpu_ops(std::vector<PendingOp*> ops) {
  // What NCCL cannot do fails here, where every rank has the same agreed spec: refused at submit,
  // a rank whose counts differed from its peers' would leave them waiting.
  std::erase_if(ops, [&](PendingOp* op) {
    if (op->spec.kind != OpKind::Reducescatter || blocks_equal(op->spec.counts)) return false;
    finish(*op, DDL_ERROR_UNSUPPORTED, fmt::format("reducescatter '{}' of CUDA buffers needs the same count for every rank", op->name));
    return true;
  });
  if (ops.empty()) return;
  // Every rank checks the same alltoallvs in the same order (host collectives); a failed one is gone.
  std::erase_if(ops, [&](PendingOp* op) { return op->spec.kind == OpKind::Alltoallv && !gpu_alltoallv_counts_agree(*op); });
  if (ops.empty()) return;
  // CUDA allreduces fuse as host ones do: copied into a fusion buffer on their stream, reduced by
  // one NCCL call, copied out. The copies stay outside the NCCL group, whose ops reach the stream
  // only at its end.
  std::vector<PendingOp*> allreduces, others;
  for (PendingOp* op : ops) (op->spec.kind == OpKind::Allreduce && gpu_->fuses() ? allreduces : others).push_back(op);
  std::vector<GpuFusion> fused;
  for (std::vector<PendingOp*>& group : fusion_groups(allreduces)) {
    if (group.size() == 1)
      others.push_back(group[0]);
    else
      fused.push_back(fill_gpu_fusion_buffer(std::move(group)));
  }
  const std::vector<StagedGpuInput> staged = stage_gpu_inputs_that_overlap(others);
  const auto launched = Clock::now();
  gpu_->group_start();
  for (const GpuFusion& f : fused) {
    const OpSpec& s = f.ops[0]->spec;
    gpu_->allreduce(f.buffer, f.buffer, f.count, s.dtype, s.reduce, f.ops[0]->stream);
  }
  for (PendingOp* op : others) {
    record_wait(*op, launched);
    const OpSpec& s = op->spec;
    switch (s.kind) {
      case OpKind::Allreduce: gpu_->allreduce(op->send, op->recv, s.count, s.dtype, s.reduce, op->stream); break;
      case OpKind::Broadcast: gpu_->broadcast(op->recv, s.count, s.dtype, s.root, op->stream); break;
      case OpKind::Allgather: gpu_->allgather(op->send, op->recv, s.count, s.dtype, op->stream); break;
      case OpKind::Reducescatter:  // equal blocks (checked above)
        gpu_->reduce_scatter(op->send, op->recv, s.counts[static_cast<size_t>(rank_)], s.dtype, s.reduce, op->stream);
        break;
      case OpKind::Alltoallv: gpu_->alltoallv(op->send, op->send_counts, op->recv, op->recv_counts, s.dtype, op->stream); break;
      default: break;  // the C API offers no other CUDA op
    }
  }
  gpu_->group_end();
  const auto enqueued = Clock::now();
  for (const StagedGpuInput& input : staged) {
    input.op->send = input.send;
    gpu_->release_buffer(input.buffer, input.op->stream);
  }
  for (const GpuFusion& f : fused) empty_gpu_fusion_buffer(f, launched, enqueued);
  mark_gpu_ops_by_stream(ops, enqueued);
}

// NCCL reads an allgather's or alltoallv's input while it writes the output (a peer's block may
// land before this rank's own is sent), so an input that shares memory with the output is copied
// to a buffer of its own first, on the op's stream; an op's send may be its recv (ddl.h). An
// allgather whose input is its own block of the output is NCCL's in place, which needs no copy.
std::vector<Engine::StagedGpuInput> Engine::stage_gpu_inputs_that_overlap(const std::vector<PendingOp*>& ops) {
  std::vector<StagedGpuInput> staged;
  for (PendingOp* op : ops) {
    const OpSpec& s = op->spec;
    const size_t element = dtype_size(s.dtype);
    size_t send_bytes = 0, recv_bytes = 0;
    if (s.kind == OpKind::Allgather) {
      send_bytes = s.count * element;
      recv_bytes = send_bytes * static_cast<size_t>(size_);
      if (op->send == static_cast<const char*>(op->recv) + static_cast<size_t>(rank_) * send_bytes) continue;
    } else if (s.kind == OpKind::Alltoallv) {
      for (size_t c : op->send_counts) send_bytes += c * element;
      for (size_t c : op->recv_counts) recv_bytes += c * element;
    } else {
      continue;
    }
    if (!bytes_overlap(op->send, send_bytes, op->recv, recv_bytes)) continue;
    void* buffer = gpu_->buffer(send_bytes, op->stream);
    gpu_->copy(buffer, op->send, send_bytes, op->stream);
    staged.push_back({op, op->send, buffer});
    op->send = buffer;
  }
  return staged;
}

Engine::GpuFusion Engine::fill_gpu_fusion_buffer(std::vector<PendingOp*> ops) {
  GpuFusion f;
  const size_t element = dtype_size(ops[0]->spec.dtype);
  for (PendingOp* op : ops) f.count += op->spec.count;
  void* stream = ops[0]->stream;  // the group's: the others' streams wait for it and it for them
  f.started = Clock::now();
  for (PendingOp* op : ops)
    if (op->stream != stream) gpu_->order_after(stream, op->stream);
  f.buffer = static_cast<char*>(gpu_->buffer(f.count * element, stream));
  size_t offset = 0;
  for (PendingOp* op : ops) {
    record_wait(*op, f.started);
    gpu_->copy(f.buffer + offset * element, op->send, op->spec.count * element, stream);
    offset += op->spec.count;
  }
  f.ops = std::move(ops);
  return f;
}

// The results out of the fusion buffer, and the buffer back to its pool, all on the group's stream.
// The timeline's phases for these ops are when the engine enqueued each part; the GPU's own time
// for the whole is the NCCL phase that follows (until the stream's event completes).
void Engine::empty_gpu_fusion_buffer(const GpuFusion& f, Clock::time_point launched, Clock::time_point reduced) {
  const size_t element = dtype_size(f.ops[0]->spec.dtype);
  void* stream = f.ops[0]->stream;
  size_t offset = 0;
  for (PendingOp* op : f.ops) {
    gpu_->copy(op->recv, f.buffer + offset * element, op->spec.count * element, stream);
    offset += op->spec.count;
  }
  gpu_->release_buffer(f.buffer, stream);
  for (PendingOp* op : f.ops)
    if (op->stream != stream) gpu_->order_after(op->stream, stream);  // its event (mark) then follows the copy out
  const auto copied = Clock::now();
  for (PendingOp* op : f.ops) {
    record(op->name, "MEMCPY_IN_FUSION_BUFFER", f.started, launched);
    record(op->name, "ALLREDUCE", launched, reduced);
    record(op->name, "MEMCPY_OUT_FUSION_BUFFER", reduced, copied);
  }
}

// One event per stream, after everything the round enqueued there: the ops on it complete together
// (a step's gradients on torch's current stream are one wait, not one per gradient). Only after the
// NCCL group has ended are its ops on their streams: an event recorded inside it could complete first.
void Engine::mark_gpu_ops_by_stream(const std::vector<PendingOp*>& ops, Clock::time_point enqueued) {
  std::vector<GpuOpInFlight> marked;
  for (PendingOp* op : ops) {
    auto same = std::find_if(marked.begin(), marked.end(), [&](const GpuOpInFlight& g) { return g.stream == op->stream; });
    if (same == marked.end()) same = marked.insert(marked.end(), GpuOpInFlight{{}, nullptr, enqueued, op->stream});
    same->names.push_back(op->name);
  }
  for (GpuOpInFlight& g : marked) {
    g.token = gpu_->mark(g.stream);
    gpu_in_flight_.push_back(std::move(g));
  }
}

void Engine::poll_gpu_ops() {
  const auto now = Clock::now();
  for (size_t i = 0; i < gpu_in_flight_.size();) {
    GpuOpInFlight& g = gpu_in_flight_[i];
    if (!gpu_->done(g.token)) {
      if (now - g.started > config_.timeout) throw TimeoutError(fmt::format("CUDA op '{}' timed out", g.names[0]));
      ++i;
      continue;
    }
    gpu_->release(g.token);
    std::vector<PendingOp*> done;
    for (const std::string& name : g.names) {
      record(name, "NCCL", g.started, now);
      done.push_back(&in_flight_.at(name));
    }
    finish(done, DDL_SUCCESS);
    gpu_in_flight_.erase(gpu_in_flight_.begin() + static_cast<long>(i));
  }
}

// Allreduces of one dtype, reduction and compression, in the agreed order, up to the fusion
// threshold's bytes together (each alone with a threshold of 0): from the agreed specs alone, so
// every rank groups alike (a CUDA op's stream is this rank's own).
std::vector<std::vector<Engine::PendingOp*>> Engine::fusion_groups(const std::vector<PendingOp*>& ops) const {
  std::vector<std::vector<PendingOp*>> groups;
  std::vector<bool> taken(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (taken[i]) continue;
    std::vector<PendingOp*>& group = groups.emplace_back(1, ops[i]);
    taken[i] = true;
    size_t bytes = bytes_of(ops[i]->spec);
    for (size_t j = i + 1; j < ops.size() && config_.fusion_threshold > 0; ++j) {
      const OpSpec& a = ops[i]->spec;
      const OpSpec& b = ops[j]->spec;
      if (taken[j] || a.dtype != b.dtype || a.reduce != b.reduce || a.compress_fp16 != b.compress_fp16) continue;
      if (bytes + bytes_of(b) > config_.fusion_threshold) continue;
      bytes += bytes_of(b);
      group.push_back(ops[j]);
      taken[j] = true;
    }
  }
  return groups;
}

void Engine::run_allreduces(const std::vector<PendingOp*>& ops) {
  for (const std::vector<PendingOp*>& group : fusion_groups(ops)) {
    if (group.size() == 1 && !group[0]->spec.compress_fp16)
      run_single(*group[0]);
    else
      run_fused_allreduce(group);
  }
}

void Engine::run_fused_allreduce(const std::vector<PendingOp*>& ops) {
  if (run_fused_allreduce_in_place(ops)) return;
  // Compressed float32 ops travel as float16: half the bytes in the buffer and on the wire.
  const bool compress = ops[0]->spec.compress_fp16;
  const ddl_dtype dtype = ops[0]->spec.dtype;
  const ddl_dtype wire = compress ? DDL_FLOAT16 : dtype;
  const ddl_reduce_op reduce = ops[0]->spec.reduce;
  const size_t wire_element_size = dtype_size(wire);
  size_t total_count = 0;
  for (PendingOp* op : ops) total_count += op->spec.count;
  if (fusion_buffer_.size() < total_count * wire_element_size) fusion_buffer_.resize(total_count * wire_element_size);

  auto t0 = Clock::now();
  for (PendingOp* op : ops) record_wait(*op, t0);
  size_t offset = 0;
  for (PendingOp* op : ops) {
    pack_into(op->send, fusion_buffer_.data() + offset * wire_element_size, op->spec.count, dtype, compress);
    scale(fusion_buffer_.data() + offset * wire_element_size, op->spec.count, wire, op->spec.prescale);
    offset += op->spec.count;
  }
  auto t1 = Clock::now();
  collectives_->allreduce(fusion_buffer_.data(), total_count * wire_element_size, wire_element_size, reduce_function(wire, reduce));
  auto t2 = Clock::now();
  offset = 0;
  for (PendingOp* op : ops) {
    unpack_from(fusion_buffer_.data() + offset * wire_element_size, op->recv, op->spec.count, dtype, compress);
    finish_reduction(op->recv, op->spec.count, op->spec);
    offset += op->spec.count;
  }
  auto t3 = Clock::now();
  for (PendingOp* op : ops) {
    record(op->name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
    record(op->name, "ALLREDUCE", t1, t2);
    record(op->name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
  }
  finish(ops, DDL_SUCCESS);
}

// Without a fusion buffer, where the transport reduces straight from the ops' buffers (shared
// memory) and no op needs its input changed first (fp16 compression, prescaling). The timeline
// shows one ALLREDUCE phase: there was no copy into a fusion buffer.
bool Engine::run_fused_allreduce_in_place(const std::vector<PendingOp*>& ops) {
  const OpSpec& first = ops[0]->spec;
  if (!collectives_->reduces_pieces() || first.compress_fp16) return false;
  if (std::any_of(ops.begin(), ops.end(), [](const PendingOp* op) { return op->spec.prescale != 1.0; })) return false;
  pieces_.clear();
  for (PendingOp* op : ops) pieces_.push_back({op->send, op->recv, op->spec.count * dtype_size(op->spec.dtype)});
  const auto start = Clock::now();
  for (PendingOp* op : ops) record_wait(*op, start);
  collectives_->allreduce_pieces(pieces_, dtype_size(first.dtype), reduce_function(first.dtype, first.reduce));
  for (PendingOp* op : ops) finish_reduction(op->recv, op->spec.count, op->spec);
  const auto end = Clock::now();
  for (PendingOp* op : ops) record(op->name, "ALLREDUCE", start, end);
  finish(ops, DDL_SUCCESS);
  return true;
}

// A reduction's `count` result elements at `recv` become the op's: divided by the world size for
// an average, then post-scaled. An integer average with a post-scale is scaled once, by
// postscale / size, as Horovod does: dividing first would truncate before the scale ((3 / 2) * 3
// would be 3, not 4).
void Engine::finish_reduction(void* recv, size_t count, const OpSpec& s) const {
  const bool integer = s.dtype != DDL_FLOAT16 && s.dtype != DDL_BFLOAT16 && s.dtype != DDL_FLOAT32 && s.dtype != DDL_FLOAT64;
  if (s.reduce == DDL_AVERAGE && integer && s.postscale != 1.0) return scale(recv, count, s.dtype, s.postscale / size_);
  if (s.reduce == DDL_AVERAGE) divide_by_world_size(recv, count, s.dtype, size_);
  scale(recv, count, s.dtype, s.postscale);
}

void Engine::run_single(PendingOp& op) {
  const OpSpec& s = op.spec;
  const size_t element = dtype_size(s.dtype);
  const size_t bytes = bytes_of(s);
  auto start = Clock::now();
  record_wait(op, start);
  switch (s.kind) {
    case OpKind::Allreduce:
      if (op.send != op.recv) move_bytes(op.recv, op.send, bytes);
      scale(op.recv, s.count, s.dtype, s.prescale);
      collectives_->allreduce(op.recv, s.count * element, element, reduce_function(s.dtype, s.reduce));
      finish_reduction(op.recv, s.count, s);
      break;
    case OpKind::Broadcast: collectives_->broadcast(op.recv, bytes, s.root); break;
    case OpKind::Allgather: collectives_->allgatherv(op.send, op.recv, std::vector<size_t>(static_cast<size_t>(size_), bytes)); break;
    case OpKind::Allgatherv: {
      std::vector<size_t> per_rank;
      for (uint64_t c : s.counts) per_rank.push_back(c * element);
      collectives_->allgatherv(op.send, op.recv, per_rank);
      break;
    }
    case OpKind::Alltoall: collectives_->alltoall(op.send, op.recv, bytes); break;
    case OpKind::Barrier: collectives_->barrier(); break;
    case OpKind::Reducescatter: run_reducescatter(op); break;
    case OpKind::Alltoallv:
      if (!run_alltoallv(op)) return;  // finished with its error
      break;
    case OpKind::AllgatherAny: run_allgather_any(op); break;
    case OpKind::AlltoallAny: run_alltoall_any(op); break;
    case OpKind::Join: {
      // Every rank leaves the join in this round; each starts numbering its unnamed ops afresh,
      // since ranks made different numbers of them while some waited here.
      std::lock_guard lock(mutex_);
      unnamed_counter_ = 0;
      order_broken_.reset();  // the negotiator's too: numbered afresh, every rank is in step again
      op.state->set_gathered({static_cast<uint64_t>(op.join_result)}, {});
      break;
    }
  }
  record(op.name, op_kind_name(s.kind), start, Clock::now());
  finish(op, DDL_SUCCESS);
}

// Reduces the whole input in a staging buffer, then keeps this rank's block: the transports have
// no reduce-scatter of their own, and this costs one allreduce of the input.
void Engine::run_reducescatter(PendingOp& op) {
  const OpSpec& s = op.spec;
  const size_t element = dtype_size(s.dtype);
  if (scratch_.size() < s.count * element) scratch_.resize(s.count * element);
  copy_bytes(scratch_.data(), op.send, s.count * element);
  scale(scratch_.data(), s.count, s.dtype, s.prescale);
  collectives_->allreduce(scratch_.data(), s.count * element, element, reduce_function(s.dtype, s.reduce));
  size_t offset = 0;
  for (int r = 0; r < rank_; ++r) offset += s.counts[static_cast<size_t>(r)];
  const size_t mine = s.counts[static_cast<size_t>(rank_)];
  copy_bytes(op.recv, scratch_.data() + offset * element, mine * element);
  finish_reduction(op.recv, mine, s);
}

// Blocks of different sizes travel as one alltoall of blocks padded to the largest block any rank
// sends, which every rank first learns with a max-allreduce.
// Exchanges op.send's blocks (op.send_counts[j] elements for rank j, in rank order) in blocks as
// large as the largest any rank sends; returns that size in elements. Block j of the result lies
// at scratch_ + (size + j) * block bytes. `mismatch`: in, whether this rank found counts that do
// not match; out, whether any rank did (the same max-allreduce tells), and then nothing is exchanged.
size_t Engine::exchange_blocks(const PendingOp& op, bool& mismatch) {
  const size_t element = dtype_size(op.spec.dtype);
  const auto ranks = static_cast<size_t>(size_);
  int64_t agreed[2] = {0, mismatch ? 1 : 0};  // the largest block, and whether any rank's counts mismatch
  for (size_t c : op.send_counts) agreed[0] = std::max(agreed[0], static_cast<int64_t>(c));
  collectives_->allreduce(agreed, sizeof agreed, sizeof(int64_t), reduce_function(DDL_INT64, DDL_MAX));
  mismatch = agreed[1] != 0;
  if (mismatch) return 0;
  const int64_t block = agreed[0];
  const size_t block_bytes = static_cast<size_t>(block) * element;
  if (scratch_.size() < 2 * ranks * block_bytes) scratch_.resize(2 * ranks * block_bytes);
  char* out = scratch_.data();
  const char* from = static_cast<const char*>(op.send);
  for (size_t j = 0; j < ranks; ++j) {
    copy_bytes(out + j * block_bytes, from, op.send_counts[j] * element);
    from += op.send_counts[j] * element;
  }
  if (block_bytes > 0) collectives_->alltoall(out, out + ranks * block_bytes, block_bytes);
  return static_cast<size_t>(block);
}

// Copies the first counts[j] elements of each received block j, in rank order, to `to`.
void Engine::unpack_blocks(size_t block, const std::vector<size_t>& counts, ddl_dtype dtype, char* to) {
  const size_t element = dtype_size(dtype);
  const char* in = scratch_.data() + static_cast<size_t>(size_) * block * element;
  for (size_t j = 0; j < counts.size(); ++j) {
    copy_bytes(to, in + j * block * element, counts[j] * element);
    to += counts[j] * element;
  }
}

// Every rank first tells each other how much it sends it (one small alltoall): a rank that expects
// another count from a peer would otherwise get a block cut short, or padding and stale bytes.
// If any rank's counts differ, every rank fails the op (the collectives ran, so ranks stay in step).
bool Engine::run_alltoallv(PendingOp& op) {
  const std::vector<uint64_t> sent_to_me = counts_sent_to_me(op);
  const std::optional<size_t> differing = first_unexpected_count(op, sent_to_me);
  bool mismatch = differing.has_value();
  const size_t block = exchange_blocks(op, mismatch);
  if (mismatch) {
    finish(op, DDL_ERROR_MISMATCH, alltoallv_mismatch(op, sent_to_me, differing));
    return false;
  }
  unpack_blocks(block, op.recv_counts, op.spec.dtype, static_cast<char*>(op.recv));
  return true;
}

bool Engine::blocks_equal(const std::vector<uint64_t>& counts) {
  return std::all_of(counts.begin(), counts.end(), [&](uint64_t c) { return c == counts.front(); });
}

// A buffer of the round's CUDA ops, whose GPU the communicator is made on: an empty one may be NULL.
const void* Engine::gpu_buffer_of(const std::vector<PendingOp*>& ops) {
  for (const PendingOp* op : ops) {
    if (op->recv != nullptr) return op->recv;
    if (op->send != nullptr) return op->send;
  }
  return nullptr;  // the current GPU
}

// NCCL's sends and receives must pair up in size (a receive of another count hangs or cuts a block
// short), so a CUDA alltoallv's counts are checked on the host first, as a host one's are.
bool Engine::gpu_alltoallv_counts_agree(PendingOp& op) {
  const std::vector<uint64_t> sent_to_me = counts_sent_to_me(op);
  const std::optional<size_t> differing = first_unexpected_count(op, sent_to_me);
  int64_t any_mismatch = differing.has_value() ? 1 : 0;
  collectives_->allreduce(&any_mismatch, sizeof any_mismatch, sizeof any_mismatch, reduce_function(DDL_INT64, DDL_MAX));
  if (any_mismatch == 0) return true;
  finish(op, DDL_ERROR_MISMATCH, alltoallv_mismatch(op, sent_to_me, differing));
  return false;
}

// The first rank whose block to this one differs from what this one expects from it, if any.
std::optional<size_t> Engine::first_unexpected_count(const PendingOp& op, const std::vector<uint64_t>& sent_to_me) const {
  for (size_t r = 0; r < sent_to_me.size(); ++r)
    if (sent_to_me[r] != op.recv_counts[r]) return r;
  return std::nullopt;
}

std::string Engine::alltoallv_mismatch(const PendingOp& op, const std::vector<uint64_t>& sent_to_me,
                                       std::optional<size_t> differing) const {
  if (!differing)
    return fmt::format("alltoallv '{}': another rank expected other counts than its peers sent it (its error names them)", op.name);
  return fmt::format("alltoallv '{}': rank {} expected {} elements from rank {}, which sent it {}", op.name, rank_,
                     op.recv_counts[*differing], *differing, sent_to_me[*differing]);
}

// How many elements each rank sends this one in `op` (one small alltoall of every rank's send counts).
std::vector<uint64_t> Engine::counts_sent_to_me(const PendingOp& op) {
  std::vector<uint64_t> sending(op.send_counts.begin(), op.send_counts.end()), receiving(static_cast<size_t>(size_));
  collectives_->alltoall(sending.data(), receiving.data(), sizeof(uint64_t));
  return receiving;
}

// Each rank's count for every other first, then the data into a buffer the handle keeps: no rank
// needs to know beforehand what it will receive.
void Engine::run_alltoall_any(PendingOp& op) {
  std::vector<uint64_t> receiving = counts_sent_to_me(op);
  bool mismatch = false;  // every count is learned here: none can differ
  const size_t block = exchange_blocks(op, mismatch);
  std::vector<size_t> counts(receiving.begin(), receiving.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<char> data(total * dtype_size(op.spec.dtype));
  unpack_blocks(block, counts, op.spec.dtype, data.data());
  op.state->set_gathered(std::move(receiving), std::move(data));
}

// Every rank's count first (one small allgather), then the data into a buffer the handle keeps.
void Engine::run_allgather_any(PendingOp& op) {
  const size_t element = dtype_size(op.spec.dtype);
  const auto ranks = static_cast<size_t>(size_);
  uint64_t mine = op.send_counts.at(0);
  std::vector<uint64_t> counts(ranks);
  collectives_->allgatherv(&mine, counts.data(), std::vector<size_t>(ranks, sizeof mine));
  std::vector<size_t> bytes(ranks);
  size_t total = 0;
  for (size_t r = 0; r < ranks; ++r) total += bytes[r] = counts[r] * element;
  std::vector<char> data(total);
  collectives_->allgatherv(op.send, data.data(), bytes);
  op.state->set_gathered(std::move(counts), std::move(data));
}

Engine::PendingOp& Engine::stand_in_for(const ReadyOp& ready) {
  if (!joined_) throw std::runtime_error(fmt::format("op '{}' was agreed but never submitted on rank {}", ready.name(), rank_));
  auto& [op, buffer] = stand_ins_.emplace_back();
  op = PendingOp{ready.name(), ready.spec(), nullptr, nullptr, std::make_shared<OpState>(), Clock::now(), nullptr};
  const OpSpec& s = ready.spec();
  const size_t element = dtype_size(s.dtype);
  if (s.kind == OpKind::Allreduce) {
    buffer.assign(s.count * element, 0);
    fill_identity(buffer.data(), s.count, s.dtype, s.reduce);
    op.send = op.recv = buffer.data();
  } else if (s.kind == OpKind::Reducescatter) {
    buffer.assign((s.count + s.counts[static_cast<size_t>(rank_)]) * element, 0);
    fill_identity(buffer.data(), s.count, s.dtype, s.reduce);
    op.send = buffer.data();
    op.recv = buffer.data() + s.count * element;
  } else if (s.kind == OpKind::AllgatherAny) {
    op.send = buffer.data();
    op.send_counts = {0};
  }
  return op;
}

void Engine::record(const std::string& op_name, const char* phase, Clock::time_point start, Clock::time_point end) {
  if (!timeline_->enabled()) return;
  if (config_.timeline_rows.empty())
    timeline_->record(op_name, phase, start, end);
  else
    timeline_->record(config_.timeline_rows + op_name, phase, start, end);
}

void Engine::record_wait(const PendingOp& op, Clock::time_point started) { record(op.name, "WAIT", op.agreed, started); }

void Engine::finish(PendingOp& op, ddl_status status, const std::string& message) { finish({&op}, status, message); }

void Engine::finish(const std::vector<PendingOp*>& ops, ddl_status status, const std::string& message) {
  std::vector<std::shared_ptr<OpState>> states;
  std::vector<std::string> copy_errors;  // a staged CUDA op's, by its place in `ops`
  states.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    PendingOp& op = *ops[i];
    if (!op.staged) continue;
    if (status == DDL_SUCCESS) copy_result_to_device(op);
    if (!op.staging_error.empty()) {
      copy_errors.resize(ops.size());
      copy_errors[i] = fmt::format("op '{}': {}", op.name, std::exchange(op.staging_error, {}));
    }
    std::vector<char>().swap(op.staging);  // a node kept for reuse keeps no gradient-sized buffer
    op.staged = false;
  }
  {
    std::lock_guard lock(mutex_);  // submit() reads in_flight_ for duplicate names
    for (PendingOp* op : ops) {
      if (op->spec.kind == OpKind::Join) joined_ = false;  // however it ended: this rank stands in no more
      states.push_back(std::move(op->state));
      if (auto it = in_flight_.find(op->name); it != in_flight_.end()) {  // `op` is gone after this
        OpTable::node_type node = in_flight_.extract(it);
        if (spare_nodes_.size() < kSpareNodes && worth_keeping(node.mapped())) spare_nodes_.push_back(std::move(node));
      }
    }
  }
  if (status == DDL_SUCCESS) progress_.note();
  std::vector<OpState*> settled;
  for (size_t i = 0; i < states.size(); ++i) {
    const bool copy_failed = i < copy_errors.size() && !copy_errors[i].empty();
    if (copy_failed ? states[i]->settle(DDL_ERROR_INTERNAL, copy_errors[i]) : states[i]->settle(status, message))
      settled.push_back(states[i].get());
  }
  for (OpState* state : settled) state->wake();
}

void Engine::fail_everything(ddl_status status, const std::string& message) {
  std::lock_guard lock(mutex_);
  broken_ = true;
  broken_status_ = status;
  broken_message_ = message;
  for (auto& [name, op] : in_flight_) op.state->complete(status, message);
  for (auto& [name, op] : inbox_) op.state->complete(status, message);
  in_flight_.clear();
  inbox_.clear();
  inbox_order_.clear();
  inbox_bytes_ = 0;
}

}  // namespace ddl::runtime
