// The engine of libddl: ops are queued by name from any thread; a background thread runs
// negotiation rounds with the other ranks (which named ops has everyone submitted?), fuses ready
// allreduces of one type into one buffer, runs the collectives, and completes the handles.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/worker_contract.hpp"
#include "runtime/src/core/op_spec.hpp"
#include "runtime/src/engine/negotiator.hpp"
#include "runtime/src/engine/progress_mark.hpp"
#include "runtime/src/engine/timeline.hpp"
#include "runtime/src/transports/collectives.hpp"
#include "runtime/src/transports/device_memory.hpp"
#include "runtime/src/transports/gpu_collectives.hpp"

namespace ddl::runtime {

// The outcome of one op, shared by the engine (which completes it) and the caller (who waits).
class OpState {
 public:
  void complete(ddl_status status, std::string message) {
    if (settle(status, std::move(message))) wake();
  }
  // The two halves of complete(): settle a whole batch before waking any waiter, so a caller
  // waiting on the batch's handles one by one finds the rest already done instead of sleeping and
  // being woken once per handle. settle() returns false if the op was already complete.
  bool settle(ddl_status status, std::string message);
  void wake() { cv_.notify_all(); }
  ddl_status wait(std::string& message);
  bool done();
  // Completes an op the engine refused in the submitting call (a name in flight, after finalize,
  // a broken world), before anyone else can see it: refused() tells it from an op that ran and
  // failed, which only its wait may report.
  void refuse(ddl_status status, std::string message) {
    refused_ = true;
    complete(status, std::move(message));
  }
  bool refused() const { return refused_; }
  // An AllgatherAny's result, kept here until the handle is released.
  void set_gathered(std::vector<uint64_t> counts, std::vector<char> data) {
    gathered_counts_ = std::move(counts);
    gathered_ = std::move(data);
  }
  const std::vector<uint64_t>& gathered_counts() const { return gathered_counts_; }
  const std::vector<char>& gathered() const { return gathered_; }

 private:
  std::vector<uint64_t> gathered_counts_;
  std::vector<char> gathered_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  bool refused_ = false;  // written only before the state leaves the submitting thread
  ddl_status status_ = DDL_SUCCESS;
  std::string message_;
};

// The defaults are the worker contract's (common/worker_contract.hpp); libddl reads the settings.
struct EngineConfig {
  std::chrono::microseconds cycle_time{static_cast<long long>(contract::kCycleTimeMs.fallback * 1000)};  // fractions of a ms allowed
  size_t fusion_threshold = static_cast<size_t>(contract::kFusionThreshold.fallback);                    // 0 = no fusion
  // An op waiting longer for a rank fails.
  std::chrono::milliseconds timeout{static_cast<long long>(contract::kTimeout.fallback * 1000)};
  std::string timeout_setting = contract::kTimeout.name;  // what a user raises it with, for the message of an op that timed out
  std::string timeline_path;                              // DDL_TIMELINE for this rank; empty = none
  // A process set's engine records into the world's timeline (the world's engine opens and closes
  // it), its rows named `timeline_rows` + the op's name, so that a set's "allreduce.1" is not the
  // world's. Unset: the engine has a timeline of its own, at timeline_path.
  std::shared_ptr<Timeline> timeline;
  std::string timeline_rows;
  std::string progress_path;     // the hang watchdog's file for this rank (DDL_WATCH_DIR); empty = none
  std::vector<int> world_ranks;  // a process set's members, which errors name; empty: the world
  // DDL_REPORT_STRAGGLERS (the world's engine only): rank 0 writes on stderr which ranks the others
  // waited for (StragglerTally), when it finalizes and, when set, every this often.
  bool report_stragglers = false;
  std::chrono::seconds straggler_interval{0};
  std::vector<std::string> rank_hosts;  // each rank's host, for that report (rank 0's engine)
  // CUDA ops go through host memory (DDL_CUDA_VIA_HOST) rather than NCCL; they do anyway where a
  // rank cannot load NCCL or ranks share a GPU (agree_on_gpu_route).
  bool cuda_via_host = false;
  // The copies between GPU and host for that; empty: the CUDA runtime's, made when first needed.
  std::shared_ptr<DeviceMemory> device_memory;
  // Where CUDA ops go when set, on every rank (the engine's tests play GPU collectives on host
  // memory); empty: the route the ranks agree on (agree_on_gpu_route).
  std::function<std::unique_ptr<GpuCollectives>(Collectives& host)> gpu_collectives;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(std::unique_ptr<Collectives> collectives, EngineConfig config);
  ~Engine();  // finalizes if finalize() was not called
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Rank 0's straggler report (EngineConfig::report_stragglers), at exit of a process that never
  // finalized (a round may be under way meanwhile).
  void report_stragglers_at_exit();
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Queues an op. An empty name takes the next "unnamed.N". Never blocks on peers. `stream` is the
  // CUDA stream of a CUDA op.
  std::shared_ptr<OpState> submit(std::string name, OpSpec spec, const void* send, void* recv, void* stream = nullptr);
  // An op with counts of this rank alone, in elements, not part of the agreed spec: an alltoallv's
  // blocks, or {send count} of an allgather-any.
  std::shared_ptr<OpState> submit_with_counts(std::string name, OpSpec spec, const void* send, void* recv, std::vector<size_t> send_counts,
                                              std::vector<size_t> recv_counts, void* stream = nullptr);
  // Runs an op to completion on the calling thread, as submit() + wait would, but without handing
  // it to the engine thread: the caller runs the negotiation rounds itself until its op is done.
  // When nothing else is in flight and the op is a host allreduce, broadcast or barrier that every
  // rank can name alike (a named op that ran before, so in the response cache, or an unnamed one),
  // the caller proposes it in its round; if every rank proposed the same op in that round it runs
  // there, without waiting for the negotiation (on shared memory, the round and a small op are one
  // barrier). A CUDA op (on `stream`) is never proposed: the caller's rounds negotiate it, enqueue
  // it and see its event complete, with no hand-over to the engine thread and back. Ops while
  // another thread runs rounds are submitted and waited for.
  // Returns the op's status, `message` the error.
  ddl_status run(std::string name, OpSpec spec, const void* send, void* recv, std::string& message, void* stream = nullptr);
  // Runs the rounds on the calling thread until the op of `state` (submitted here) is done, as
  // run() does, while no other thread runs them; returns at once where one does (the op is then
  // theirs to finish: wait on `state`). The op then completes on the waiting thread, not on the
  // engine thread, which would have to wake it (a thread hand-over per op: most of an async op's
  // cost when it is waited for at once).
  void run_rounds_until_done(OpState& state);
  // run_rounds_until_done, then the op's status (`message` the error).
  ddl_status wait(OpState& state, std::string& message) {
    run_rounds_until_done(state);
    return state.wait(message);
  }
  Timeline& timeline() { return *timeline_; }
  // The timeline, for a process set's engine to record into (EngineConfig::timeline).
  std::shared_ptr<Timeline> shared_timeline() const { return timeline_; }
  // Tells the other ranks this one is done and waits until all are; ops still pending then fail.
  // Returns DDL_SUCCESS then, or why it stopped waiting: the transport broke, or some rank had not
  // finalized within the timeout of the request (DDL_ERROR_TIMEOUT: this rank leaves without it,
  // and that rank's next round finds it gone). The timeline is closed when it returns (whichever
  // thread destroys the engine later).
  std::pair<ddl_status, std::string> finalize();
  // finalize() without the wait: the engine thread tells the others and goes on taking part in
  // rounds until all are done; finalize() then only waits for that. New ops are refused at once.
  void request_finalize();

 private:
  using Clock = std::chrono::steady_clock;
  struct PendingOp {
    std::string name;
    OpSpec spec;
    const void* send = nullptr;
    void* recv = nullptr;
    std::shared_ptr<OpState> state;
    Clock::time_point submitted;
    void* stream = nullptr;
    Clock::time_point agreed;                      // when every rank had submitted it
    int join_result = -1;                          // a join: the last rank to join
    std::vector<size_t> send_counts, recv_counts;  // alltoallv: this rank's blocks; allgather-any: {its count}
    // A CUDA op run through host memory (stage_on_host): send and recv point into `staging`, and
    // the result goes back to `device_result` before the op completes.
    bool staged = false;
    std::vector<char> staging;
    void* device_result = nullptr;
    size_t device_result_bytes = 0;
    std::string staging_error;  // a copy between GPU and host failed: the op fails with it
  };
  // A round's CUDA ops on one stream, enqueued there, waiting for the stream's event.
  struct GpuOpInFlight {
    std::vector<std::string> names;
    GpuCollectives::Token token;
    Clock::time_point started;
    void* stream = nullptr;
  };
  // CUDA allreduces fused: copied into `buffer` (GPU memory), reduced there as one.
  struct GpuFusion {
    std::vector<PendingOp*> ops;
    char* buffer = nullptr;
    size_t count = 0;  // elements of all of them
    Clock::time_point started;
  };

  // Rounds run on whichever thread holds round_mutex_: the engine thread, or a caller in run().
  void run_loop();
  // What the engine thread does once it wakes: run a round, or only see which CUDA ops finished.
  enum class Wake { Round, PollGpu };
  Wake sleep_until_due();          // the engine thread, between rounds
  bool round_due();                // whether the engine thread has a round to run (takes mutex_)
  bool has_news() const;           // ops to announce, or ddl_finalize called (mutex_ held)
  bool waiting_for_peers() const;  // ops in flight, host or CUDA (mutex_ held)
  // In the steady state the engine thread runs a round once per cycle, not per op (mutex_ held).
  bool paced() const { return steady_ && !finalize_requested_ && inbox_bytes_ < kEagerRoundBytes && (has_news() || waiting_for_peers()); }
  Clock::time_point paced_round_due() const;  // the next cycle from the last round (mutex_ held)
  void poll_gpu_between_rounds();             // round_mutex_ held
  // `awaited`: the op a waiting caller wants; the search ends once it is done.
  std::unique_lock<std::mutex> take_round_for_caller(OpState* awaited = nullptr);
  static constexpr int kYieldingPolls = 64;  // take_round_for_caller's polls that yield (later ones sleep)
  void rounds_until_done(OpState& state);    // round_mutex_ held: rounds until the op is done or the rounds stop
  Clock::time_point idle_round_due() const;  // when an idle round is due (mutex_ held)
  void pause_between_rounds();               // a caller in run(), between rounds
  bool round();                              // false once every rank finalized
  bool complete_round(const std::vector<Announcement>& round);
  bool leave_overdue_finalize(const std::vector<Announcement>& round);  // true: this rank stops waiting
  // Runs one round's body; ends the rounds (stopped_) when every rank finalized or the transport broke.
  template <typename Body>
  void run_guarded(Body body);
  // A blocking op this rank proposes to run in the round that announces it (see run()).
  struct Offer {
    Proposal proposal;                      // empty: the op is not proposed
    std::optional<uint64_t> unnamed_index;  // an unnamed op's number (named when a name is needed)
    uint32_t cache_id = 0;                  // a named op's response-cache id
  };
  // The round of run()'s proposal; the op's status if it ran there, nullopt if it goes on as any op.
  std::optional<ddl_status> run_proposed(PendingOp& op, const Offer& offer, std::string& message);
  void name_if_unnamed(PendingOp& op, const Offer& offer);
  static std::string unnamed_name(uint64_t index);
  void run_agreed(const ProposedOp& op);  // every rank proposed it, and the transport left it to us
  static bool proposable(const OpSpec& spec);
  // "unnamed.N" for the next op submitted without a name: every rank counts alike (mutex_ held).
  std::string next_unnamed_name();
  // Why `name` cannot be submitted now, if it cannot (mutex_ held).
  std::optional<std::pair<ddl_status, std::string>> refusal_of(const std::string& name, const OpSpec& spec) const;
  void execute(const std::vector<ReadyOp>& ready);
  void run_allreduces(const std::vector<PendingOp*>& ops);
  void run_fused_allreduce(const std::vector<PendingOp*>& ops);
  bool run_fused_allreduce_in_place(const std::vector<PendingOp*>& ops);
  void finish_reduction(void* recv, size_t count, const OpSpec& s) const;
  void run_single(PendingOp& op);
  void run_reducescatter(PendingOp& op);
  bool run_alltoallv(PendingOp& op);  // false: finished with an error
  void run_alltoall_any(PendingOp& op);
  std::vector<uint64_t> counts_sent_to_me(const PendingOp& op);
  std::optional<size_t> first_unexpected_count(const PendingOp& op, const std::vector<uint64_t>& sent_to_me) const;
  std::string alltoallv_mismatch(const PendingOp& op, const std::vector<uint64_t>& sent_to_me, std::optional<size_t> differing) const;
  bool gpu_alltoallv_counts_agree(PendingOp& op);  // false: finished with DDL_ERROR_MISMATCH
  static bool blocks_equal(const std::vector<uint64_t>& counts);
  static const void* gpu_buffer_of(const std::vector<PendingOp*>& ops);
  size_t exchange_blocks(const PendingOp& op, bool& mismatch);
  void unpack_blocks(size_t block, const std::vector<size_t>& counts, ddl_dtype dtype, char* to);
  void run_allgather_any(PendingOp& op);
  // While this rank waits in ddl_join, an op the others agreed on runs here with a stand-in:
  // zeros for a reduction, nothing for a gather.
  PendingOp& stand_in_for(const ReadyOp& ready);
  std::shared_ptr<OpState> enqueue(PendingOp op);
  void add_to_inbox(PendingOp op);                 // mutex_ held; the name is not in use (refusal_of)
  static bool worth_keeping(const PendingOp& op);  // whether a finished op's node goes to spare_nodes_
  std::string in_flight_message(const std::string& name) const;
  // The op a caller of run() proposes (mutex_): outside inbox_ and in_flight_ while its proposal
  // runs, so its name is checked here. unnamed_index: the op is "unnamed.N", named only if needed.
  struct Proposing {
    const std::string* name;
    std::optional<uint64_t> unnamed_index;
  };
  std::optional<Proposing> proposing_;
  bool is_proposed(const std::string& name) const;  // mutex_ held
  void enqueue_gpu_ops(std::vector<PendingOp*> ops);
  std::vector<std::vector<PendingOp*>> fusion_groups(const std::vector<PendingOp*>& ops) const;
  // An input copied away from the output it shares memory with (stage_gpu_inputs_that_overlap);
  // `send` is the op's own, given back with the buffer once the op is enqueued.
  struct StagedGpuInput {
    PendingOp* op;
    const void* send;
    void* buffer;
  };
  std::vector<StagedGpuInput> stage_gpu_inputs_that_overlap(const std::vector<PendingOp*>& ops);
  GpuFusion fill_gpu_fusion_buffer(std::vector<PendingOp*> ops);
  void empty_gpu_fusion_buffer(const GpuFusion& f, Clock::time_point launched, Clock::time_point reduced);
  void mark_gpu_ops_by_stream(const std::vector<PendingOp*>& ops, Clock::time_point enqueued);
  // Why a round's CUDA ops cannot run, and the status they fail with on every rank.
  struct NoCudaRoute {
    ddl_status status;
    std::string why;
  };
  // The route of CUDA ops, agreed by every rank on the first (NCCL, or through host memory);
  // nullopt when there is one.
  std::optional<NoCudaRoute> choose_cuda_route(const std::vector<PendingOp*>& cuda_ops);
  std::optional<NoCudaRoute> copies_to_host_failed(const std::vector<PendingOp*>& cuda_ops);
  void route_cuda_ops(std::vector<PendingOp*>& ops);  // see choose_cuda_route; staged ops then run as host ops
  void say_cuda_goes_via_host(const std::string& because);
  void stage_on_host(PendingOp& op);          // a CUDA op's input to host memory: it then runs as a host op
  void copy_result_to_device(PendingOp& op);  // a staged op's result back to its CUDA buffer
  void poll_gpu_ops();
  void finish(PendingOp& op, ddl_status status, const std::string& message = {});
  // A batch takes one lock, and its waiters are woken only once all of its ops are settled.
  void finish(const std::vector<PendingOp*>& ops, ddl_status status, const std::string& message = {});
  // Into the timeline, on the op's row (a process set's named after the set).
  void record(const std::string& op_name, const char* phase, Clock::time_point start, Clock::time_point end);
  void record_wait(const PendingOp& op, Clock::time_point started);  // agreed until its collective starts
  void fail_everything(ddl_status status, const std::string& message);
  // The transport threw: the GPU side is aborted and every op fails with `status`.
  void fail_after_transport_error(ddl_status status, const std::string& message);
  // A transport error's message, with the peers that had been finalizing named as its likely cause.
  std::string with_finalizing_peers(std::string message);
  void note_finalizing_peers(const std::vector<Announcement>& round);
  size_t bytes_of(const OpSpec& spec) const;

  std::unique_ptr<Collectives> collectives_;
  EngineConfig config_;
  int rank_;
  int size_;
  std::unique_ptr<StragglerTally> stragglers_;  // with report_stragglers, on rank 0 of the world's engine (negotiator_ points to it)
  Negotiator negotiator_;
  std::shared_ptr<Timeline> timeline_;
  ProgressMark progress_;
  Clock::time_point next_straggler_report_{};
  std::atomic<bool> stragglers_reported_{false};  // the final report is written
  void write_straggler_report(bool final);
  std::vector<char> fusion_buffer_;
  std::vector<ReducePiece> pieces_;                                // a fused allreduce's ops, for a transport that needs no fusion buffer
  std::vector<char> scratch_;                                      // reducescatter's and alltoallv's staging buffer
  bool joined_ = false;                                            // engine thread: this rank has a join in flight
  std::deque<std::pair<PendingOp, std::vector<char>>> stand_ins_;  // this round's, with their buffers
  std::unique_ptr<GpuCollectives> gpu_;                            // NCCL, made when the first CUDA op runs
  bool cuda_via_host_ = false;                                     // CUDA ops go through host memory (decided on the first)
  std::vector<GpuOpInFlight> gpu_in_flight_;

  std::mutex mutex_;  // guards what submit() and finalize() share with the engine thread
  std::condition_variable wake_;
  // Ops by name. An op's node moves from inbox_ to in_flight_ when its round takes it (extract and
  // insert: no copy, no allocation), and keeps its address until it finishes.
  using OpTable = std::unordered_map<std::string, PendingOp>;
  OpTable inbox_;                        // submitted since the last round
  std::vector<PendingOp*> inbox_order_;  // inbox_'s ops in the order they came, which is the order they are announced in
  OpTable in_flight_;                    // submitted on this rank, announced, not yet finished
  // Nodes of finished ops, which add_to_inbox fills again: a node (and its name's and shape's room)
  // is then made and freed by the submitting thread. Freed by the engine thread instead, the memory
  // of every op would cross threads, and malloc's arenas and their locks would make submitting twice as dear.
  std::vector<OpTable::node_type> spare_nodes_;
  static constexpr size_t kSpareNodes = 4096;
  std::atomic<bool> finalize_requested_{false};                           // set under mutex_; a round reads it without the lock
  Clock::time_point finalize_requested_at_{};                             // when finalize_requested_ was set
  std::pair<ddl_status, std::string> finalize_failure_{DDL_SUCCESS, ""};  // engine thread; read once it is joined
  // mutex_: the peers (world ranks) whose last announcement said they finalize: when talking to the
  // others then fails, the likely cause is that they left (a finalizing rank waits DDL_TIMEOUT at most).
  std::vector<int> finalizing_peers_;
  bool broken_ = false;
  ddl_status broken_status_ = DDL_SUCCESS;
  std::string broken_message_;
  std::optional<FailedOp> order_broken_;  // mutex_: the negotiator's, once ops numbered by order broke (refused at submit from then on)
  uint64_t unnamed_counter_ = 0;
  static constexpr int kIdleRoundsBeforeBackoff = 100;
  int idle_rounds_ = 0;  // mutex_: consecutive rounds in which no rank did anything
  static constexpr std::chrono::microseconds kQuietBeforeBackoff{200};
  static constexpr std::chrono::microseconds kGpuPollInterval{50};  // only polling sees CUDA ops finish
  Clock::time_point last_progress_{};                               // mutex_: the last round that announced or ran something
  // mutex_: the last round in which this rank announced ops announced them all by response-cache id
  // (a training loop's later steps). Its ops then wait for the next cycle, so that one round
  // agrees all that came within it (and fuses them) rather than running a round per op.
  bool steady_ = false;
  size_t inbox_bytes_ = 0;  // mutex_: the data of the ops in inbox_
  static constexpr size_t kEagerRoundBytes = size_t{1} << 20;
  bool gpu_busy_ = false;                  // mutex_: CUDA ops were in flight after the last round
  std::atomic<Clock::rep> last_round_{0};  // when this rank last ran a round, by any thread
  std::mutex round_mutex_;                 // held while a round runs; guards the round's state (negotiator_, buffers, gpu_...)
  // Who holds round_mutex_, marked by the holder right after it takes it (Nobody for that moment).
  enum class RoundHolder : uint8_t { Nobody, EngineThread, Caller };
  std::atomic<RoundHolder> round_holder_{RoundHolder::Nobody};
  std::atomic<uint64_t> engine_thread_takes_{0};  // how often the engine thread took round_mutex_
  // Marks round_holder_ while in scope; made after the lock it marks, so it ends before the unlock.
  class RoundHolderMark {
   public:
    RoundHolderMark(std::atomic<RoundHolder>& holder, RoundHolder who) : holder_(holder) { holder_.store(who, std::memory_order_release); }
    ~RoundHolderMark() { holder_.store(RoundHolder::Nobody, std::memory_order_release); }
    RoundHolderMark(const RoundHolderMark&) = delete;
    RoundHolderMark& operator=(const RoundHolderMark&) = delete;

   private:
    std::atomic<RoundHolder>& holder_;
  };
  bool stopped_ = false;  // round_mutex_: no round runs any more (every rank finalized, or the transport broke)
  std::chrono::microseconds waiting_backoff(Clock::time_point now) const;
  std::thread thread_;
};

}  // namespace ddl::runtime
