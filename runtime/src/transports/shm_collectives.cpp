// Collectives for a world whose ranks all share one node: one POSIX shared-memory segment, each
// rank a slot in it, and a futex barrier between the steps. Data crosses memory once each way
// instead of going through TCP over loopback, and the negotiation rounds of the engine cost a
// barrier instead of a Gloo allgather.
//
// Every operation works in chunks of at most kChunk bytes per rank, through two sets of slots used
// in turn across chunks and operations alike (every rank runs the same sequence of collectives, so
// every rank's turn agrees). Writing into a set happens only after a barrier that every rank
// passed after its last read of that set, so no operation needs a barrier at its end: one barrier
// per chunk (two for allreduce: gather, then reduce). The engine's negotiation round needs none:
// every rank publishes a cache line of its own and reads its peers' (announce). A peer that dies is
// noticed within ~50 ms (its pid is gone) and one that hangs at the engine's timeout; both are
// thrown as errors, which the engine turns into a failed op on every survivor.
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <gloo/rendezvous/store.h>

#include "common/error.hpp"
#include "common/random_hex.hpp"
#include "runtime/src/core/copy_bytes.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 64;
constexpr size_t kLineBytes = 64;
constexpr size_t kRoundLinesOffset = 4096;                                       // after the Header
constexpr size_t kHeaderBytes = kRoundLinesOffset + 2 * kMaxRanks * kLineBytes;  // then the slots
constexpr std::chrono::microseconds kSpinBeforeSleep{50};
// Up to this size, on up to 4 ranks, an allreduce is reduced whole by every rank: redundant work,
// but one barrier. Above 4 ranks the size shrinks in proportion, so the redundant work stays put.
constexpr size_t kSmallAllreduceBytes = 32 << 10;
size_t small_allreduce_bytes(int size) { return kSmallAllreduceBytes * 4 / static_cast<size_t>(std::max(size, 4)); }

struct Header {
  std::atomic<uint32_t> arrived;     // ranks at the current barrier
  std::atomic<uint32_t> generation;  // bumped by the last arrival; the futex word
  std::atomic<uint32_t> sleepers;    // ranks in FUTEX_WAIT, so the last arrival wakes only when needed
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<uint32_t> published;  // bumped by a rank that published its RoundLine to sleepers; a futex word
};
static_assert(sizeof(Header) <= kRoundLinesOffset);

// What a rank publishes in a negotiation round, in one cache line of its own per set of slots (so a
// peer reads a barrier's or a tiny allreduce's whole round in one line): the proposal, the
// announcement's length and a proposed op's data when it fits `inline_data`. `round` is written last:
// once it holds the round's number, the rest of the line and the rank's slot are the round's.
struct alignas(kLineBytes) RoundLine {
  std::atomic<uint64_t> round;
  uint64_t proposal[4];
  uint64_t length;
  char inline_data[16];
};
static_assert(sizeof(RoundLine) == kLineBytes && sizeof(RoundLine::proposal) == sizeof(Proposal::words));
// RoundLine::length of a proposer, whose announcement is not published unless needed.
constexpr uint64_t kAnnouncementFollows = ~uint64_t{0};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Tells the core this is a spin-wait (it frees resources for the sibling hyperthread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

size_t chunk_bytes(int size) { return size <= 8 ? (size_t{1} << 20) : (size_t{256} << 10); }

// The pieces of a fused allreduce seen as one buffer of bytes: their inputs back to back, and their
// results likewise. `starts` is storage for each piece's first byte in the whole, kept by the caller
// so that an allreduce allocates nothing.
class Pieces {
 public:
  Pieces(std::span<const ReducePiece> pieces, size_t element_size, std::vector<size_t>& starts)
      : pieces_(pieces), element_size_(element_size), starts_(starts) {
    starts_.resize(pieces.size());
    size_t at = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      starts_[i] = at;
      at += pieces[i].bytes;
    }
    bytes_ = at;
  }

  size_t bytes() const { return bytes_; }
  size_t element_size() const { return element_size_; }

  // Calls part(piece, offset in the piece, offset in the whole, bytes) for each piece's share of
  // the whole's bytes [begin, end), in order.
  template <typename Part>
  void for_each_part(size_t begin, size_t end, Part part) const {
    if (begin >= end) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    for (; i < pieces_.size() && starts_[i] < end; ++i) {
      const size_t piece_end = starts_[i] + pieces_[i].bytes;
      const size_t from = std::max(begin, starts_[i]), to = std::min(end, piece_end);
      if (from < to) part(pieces_[i], from - starts_[i], from, to - from);
    }
  }

  // Copies the inputs' bytes [begin, end) of the whole to `to`.
  void gather(char* to, size_t begin, size_t end) const {
    for_each_part(begin, end, [&](const ReducePiece& piece, size_t in_piece, size_t at, size_t bytes) {
      copy_bytes(to + (at - begin), static_cast<const char*>(piece.send) + in_piece, bytes);
    });
  }

  // Copies `from` into the results' bytes [begin, end) of the whole.
  void scatter(const char* from, size_t begin, size_t end) const {
    for_each_part(begin, end, [&](const ReducePiece& piece, size_t in_piece, size_t at, size_t bytes) {
      copy_bytes(static_cast<char*>(piece.recv) + in_piece, from + (at - begin), bytes);
    });
  }

 private:
  std::span<const ReducePiece> pieces_;
  size_t element_size_;
  std::vector<size_t>& starts_;
  size_t bytes_ = 0;
};

class SharedMemory final : public Collectives {
 public:
  SharedMemory(int rank, int size, void* base, size_t bytes, std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        base_(static_cast<char*>(base)),
        bytes_(bytes),
        chunk_(chunk_bytes(size)),
        small_allreduce_bytes_(small_allreduce_bytes(size)),
        timeout_(timeout) {
    header()->pids[rank].store(static_cast<int32_t>(::getpid()));
  }
  ~SharedMemory() override { ::munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Waits until every rank has called it (the first barrier also waits until every rank mapped).
  void barrier() override {
    Header* h = header();
    const uint32_t generation = h->generation.load();
    if (h->arrived.fetch_add(1) + 1 == static_cast<uint32_t>(size_)) {
      h->arrived.store(0);
      h->generation.fetch_add(1);
      if (h->sleepers.load() > 0) futex(&h->generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    wait_until(h->generation, [&] { return h->generation.load() != generation; });
  }

  bool reduces_pieces() const override { return true; }

  void allreduce(void* data, size_t bytes, size_t element_size, ReduceFunction reduce) override {
    const ReducePiece whole{data, data, bytes};
    allreduce_pieces({&whole, 1}, element_size, reduce);
  }

  // Reduce-scatter then allgather through memory, chunk by chunk of the pieces seen as one buffer:
  // rank r reduces segment r of each chunk. A rank copies into its slot only the segments others
  // reduce, reads its own segment straight from its pieces, and copies back only the segments
  // others reduced: each byte crosses memory about half as often as with whole-chunk copies, and a
  // fused allreduce needs no fusion buffer.
  void allreduce_pieces(std::span<const ReducePiece> pieces, size_t element_size, ReduceFunction reduce) override {
    const Pieces whole(pieces, element_size, piece_starts_);
    if (whole.bytes() <= small_allreduce_bytes_) return allreduce_small(whole, reduce);
    const size_t per_chunk = std::max<size_t>(1, chunk_ / element_size);  // elements
    const size_t count = whole.bytes() / element_size;
    for (size_t first_element = 0; first_element < count; first_element += per_chunk) {
      const size_t n = std::min(per_chunk, count - first_element);
      const size_t first = first_element * element_size;  // the chunk's first byte in the whole
      const int set = next_set();
      auto seg_begin = [&](int r) { return n * r / size_ * element_size; };  // byte offsets in the chunk
      const size_t mine = seg_begin(rank_), mine_end = seg_begin(rank_ + 1), end = n * element_size;
      whole.gather(slot(set, rank_), first, first + mine);
      whole.gather(slot(set, rank_) + mine_end, first + mine_end, first + end);
      barrier();
      // By one rank per segment: every rank gets the same bits, every run.
      whole.for_each_part(first + mine, first + mine_end, [&](const ReducePiece& piece, size_t in_piece, size_t at, size_t bytes) {
        const size_t in_chunk = at - first;
        const char* own = static_cast<const char*>(piece.send) + in_piece;
        reduce_in_rank_order(result(set) + in_chunk, bytes / element_size, reduce,
                             [&](int r) -> const char* { return r == rank_ ? own : slot(set, r) + in_chunk; });
      });
      whole.scatter(result(set) + mine, first + mine, first + mine_end);
      barrier();
      whole.scatter(result(set), first, first + mine);
      whole.scatter(result(set) + mine_end, first + mine_end, first + end);
    }
  }

  // A small message costs one barrier instead of two: every rank publishes all of it, then every
  // rank reduces every slot itself, in rank order like the large path, so all get the same bits.
  void allreduce_small(const Pieces& whole, ReduceFunction reduce) {
    if (whole.bytes() == 0) return;
    const int set = next_set();
    whole.gather(slot(set, rank_), 0, whole.bytes());
    barrier();
    whole.for_each_part(0, whole.bytes(), [&](const ReducePiece& piece, size_t in_piece, size_t at, size_t bytes) {
      reduce_in_rank_order(static_cast<char*>(piece.recv) + in_piece, bytes / whole.element_size(), reduce,
                           [&](int r) -> const char* { return slot(set, r) + at; });
    });
  }

  // out = source(0) op source(1) op ... op source(size - 1), always in this order, so the bits
  // never depend on which rank reduces or which path an allreduce takes.
  template <typename Source>
  void reduce_in_rank_order(char* out, size_t count, ReduceFunction reduce, Source source) const {
    reduce(out, source(0), source(1), count);
    for (int r = 2; r < size_; ++r) reduce(out, out, source(r), count);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    char* buffer = static_cast<char*>(data);
    for (size_t first = 0; first < bytes; first += chunk_) {
      const size_t n = std::min(chunk_, bytes - first);
      const int set = next_set();
      if (rank_ == root) copy_bytes(slot(set, root), buffer + first, n);
      barrier();
      if (rank_ != root) copy_bytes(buffer + first, slot(set, root), n);
    }
  }

  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) override {
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    std::vector<size_t> offset(size_, 0);
    for (int r = 1; r < size_; ++r) offset[r] = offset[r - 1] + bytes_per_rank[r - 1];
    const size_t longest = *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end());
    std::vector<char> own(in, in + bytes_per_rank[rank_]);  // `send` may overlap `recv`
    for (size_t first = 0; first < longest; first += chunk_) {
      const int set = next_set();
      if (first < own.size()) copy_bytes(slot(set, rank_), own.data() + first, std::min(chunk_, own.size() - first));
      barrier();
      for (int r = 0; r < size_; ++r)
        if (first < bytes_per_rank[r]) copy_bytes(out + offset[r] + first, slot(set, r), std::min(chunk_, bytes_per_rank[r] - first));
    }
  }

  std::vector<std::string> allgather_bytes(const std::string& mine) override {
    std::vector<std::string> round;
    announce(mine, round);
    return round;
  }

  // The negotiation round of a rank that proposes an op, without a barrier: each rank publishes its
  // RoundLine (the proposal and, when it fits there, a tiny op's data; a larger one's data goes in
  // its slot) and waits for every peer's line of this round. If every rank proposed the same op,
  // it runs right there from the data, when that fit (the round and the op cost one exchange of
  // cache lines together), or the engine runs it. Otherwise some rank proposed another op or none
  // (a rank proposing nothing announces in the same step, see announce()): every rank, seeing the
  // same lines, goes on to one more step in which all announce in full; only then does a proposer
  // serialize its announcement.
  ProposalOutcome allgather_bytes_proposing(const std::function<std::string()>& mine, const ProposedOp& op,
                                            std::vector<std::string>& round) override {
    const int set = next_set();
    const uint64_t number = chunks_;
    RoundLine& line = round_line(set, rank_);
    line.length = kAnnouncementFollows;
    std::memcpy(line.proposal, op.proposal.words.data(), sizeof line.proposal);
    const bool data_inline = publish_data(set, op);
    publish_and_wait(set, number);
    if (every_rank_proposed(set, op.proposal)) {
      if (!data_inline) return ProposalOutcome::Agreed;
      run_from_slots(set, op);
      return ProposalOutcome::Ran;
    }
    announce(mine(), round);
    return ProposalOutcome::Announced;
  }

  // Every rank's announcement, without a barrier: each rank publishes its RoundLine (no proposal, the
  // announcement's length) and the announcement in the first half of its slot when it fits there
  // (always, but for a first round announcing thousands of ops in full), then waits for every peer's
  // line of this round and reads, through an allgatherv if some did not fit. A proposer in the
  // same step (allgather_bytes_proposing) makes every rank announce once more.
  //
  // Reusing a set is as safe as after a barrier: a rank publishes a step only after reading the
  // previous one, and waits for every rank to publish each step.
  void announce(const std::string& mine, std::vector<std::string>& round) {
    const int set = next_set();
    const uint64_t number = chunks_;
    RoundLine& line = round_line(set, rank_);
    line.length = mine.size();
    if (mine.size() <= announcement_room()) copy_bytes(slot(set, rank_), mine.data(), mine.size());
    std::memset(line.proposal, 0, sizeof line.proposal);
    publish_and_wait(set, number);
    std::vector<size_t> lengths(size_);
    for (int r = 0; r < size_; ++r) lengths[r] = round_line(set, r).length;
    if (std::find(lengths.begin(), lengths.end(), kAnnouncementFollows) != lengths.end()) return announce(mine, round);
    round.clear();
    if (std::all_of(lengths.begin(), lengths.end(), [&](size_t l) { return l <= announcement_room(); })) {
      for (int r = 0; r < size_; ++r) round.emplace_back(slot(set, r), lengths[r]);
      return;
    }
    size_t total = 0;
    for (size_t l : lengths) total += l;
    std::string all(total, '\0');
    allgatherv(mine.data(), all.data(), lengths);
    size_t at = 0;
    for (size_t l : lengths) {
      round.push_back(all.substr(at, l));
      at += l;
    }
  }

  void alltoall(const void* send, void* recv, size_t bytes_per_rank) override {
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    std::vector<char> own(in, in + bytes_per_rank * size_);    // `send` may be `recv`
    const size_t piece = std::max<size_t>(1, chunk_ / size_);  // of each destination's block per round
    for (size_t first = 0; first < bytes_per_rank; first += piece) {
      const int set = next_set();
      const size_t n = std::min(piece, bytes_per_rank - first);
      for (int to = 0; to < size_; ++to) copy_bytes(slot(set, rank_) + to * piece, own.data() + to * bytes_per_rank + first, n);
      barrier();
      for (int from = 0; from < size_; ++from) copy_bytes(out + from * bytes_per_rank + first, slot(set, from) + rank_ * piece, n);
    }
  }

 private:
  Header* header() const { return reinterpret_cast<Header*>(base_); }
  // Slot r of set s, then the set's result area: (size + 1) chunks per set.
  char* slot(int set, int r) const { return base_ + kHeaderBytes + (static_cast<size_t>(set) * (size_ + 1) + r) * chunk_; }
  char* result(int set) const { return slot(set, size_); }
  // A slot's first half holds an announcement, its second half a proposed op's data too large for
  // its RoundLine.
  size_t announcement_room() const { return chunk_ / 2; }
  RoundLine& round_line(int set, int r) const {
    return *reinterpret_cast<RoundLine*>(base_ + kRoundLinesOffset + (static_cast<size_t>(set) * kMaxRanks + r) * kLineBytes);
  }
  // Where rank r's data of a proposed op of `bytes` bytes is (the same answer on every rank).
  char* data_in(int set, int r, size_t bytes) const {
    return bytes <= sizeof(RoundLine::inline_data) ? round_line(set, r).inline_data : slot(set, r) + chunk_ / 2;
  }
  size_t data_room() const { return chunk_ / 2; }

  // Publishes this rank's line of step `number` and waits for every peer's.
  void publish_and_wait(int set, uint64_t number) {
    publish(round_line(set, rank_), number);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) wait_for_round(round_line(set, r), number);
  }

  // Makes this rank's line (and slot) of round `number` visible, and wakes a peer asleep waiting.
  void publish(RoundLine& line, uint64_t number) {
    // seq_cst, with the waiter's sleepers/round pair: either this sees the sleeper or it sees the round.
    line.round.store(number, std::memory_order_seq_cst);
    Header* h = header();
    if (h->sleepers.load(std::memory_order_seq_cst) > 0) {
      h->published.fetch_add(1);
      futex(&h->published, FUTEX_WAKE, INT32_MAX, nullptr);
    }
  }

  // Waits until `line` holds round `number`.
  void wait_for_round(const RoundLine& line, uint64_t number) {
    wait_until(header()->published, [&] { return line.round.load(std::memory_order_seq_cst) == number; });
  }

  // Waits until done(): peers are usually microseconds behind, so it spins, yielding the core (more
  // ranks than cores is common on one node), for up to kSpinBeforeSleep; only then it sleeps on the
  // futex `word`, whose wake-up costs tens of microseconds. Whoever makes done() true changes
  // `word` and wakes it when Header::sleepers says someone sleeps (seq_cst on both sides: either
  // the waker sees the sleeper or the sleeper sees done()). Throws at the timeout, or when a peer
  // is gone.
  template <typename Done>
  void wait_until(std::atomic<uint32_t>& word, Done done) {
    for (int i = 0; i < 64; ++i) {  // the first tries without even reading the clock
      if (done()) return;
      cpu_relax();
    }
    const auto spin_until = Clock::now() + kSpinBeforeSleep;
    while (Clock::now() < spin_until) {
      if (done()) return;
      ::sched_yield();
    }
    Header* h = header();
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const uint32_t seen = word.load();
      h->sleepers.fetch_add(1);
      const timespec slice{0, 50'000'000};
      if (!done()) futex(&word, FUTEX_WAIT, seen, &slice);
      h->sleepers.fetch_sub(1);
      if (done()) return;
      // The deadline first: when one rank stops answering, every survivor times out at about the
      // same moment, and the first to give up exits; the others must still say they timed out,
      // not that this survivor is gone.
      if (Clock::now() > deadline)
        throw TimeoutError(fmt::format("timed out after {} ms waiting for the other ranks (shared memory)", timeout_.count()));
      check_peers_alive();
    }
  }

  // Copies what this rank contributes to a proposed op into its RoundLine or slot (data_in), if the
  // op is small enough to run from there; returns whether it is (the same answer on every rank that proposed it, as
  // the proposal names the op's size).
  bool publish_data(int set, const ProposedOp& op) {
    const size_t bytes = op.bytes;
    switch (op.kind) {
      case OpKind::Allreduce:
        if (bytes > std::min(small_allreduce_bytes_, data_room())) return false;
        copy_bytes(data_in(set, rank_, bytes), op.send, bytes);
        return true;
      case OpKind::Broadcast:
        if (bytes > data_room()) return false;
        if (rank_ == op.root) copy_bytes(data_in(set, rank_, bytes), op.recv, bytes);
        return true;
      default: return true;  // a barrier has no data
    }
  }

  bool every_rank_proposed(int set, const Proposal& mine) const {
    if (mine.empty()) return false;
    for (int r = 0; r < size_; ++r)
      if (std::memcmp(round_line(set, r).proposal, mine.words.data(), sizeof mine.words) != 0) return false;
    return true;
  }

  // Runs the op every rank proposed from the data published with the proposals (a barrier has none:
  // every rank having published the round was it).
  void run_from_slots(int set, const ProposedOp& op) {
    if (op.kind == OpKind::Allreduce && op.bytes > 0)
      reduce_in_rank_order(static_cast<char*>(op.recv), op.bytes / op.element_size, op.reduce,
                           [&](int r) -> const char* { return data_in(set, r, op.bytes); });
    else if (op.kind == OpKind::Broadcast && rank_ != op.root)
      copy_bytes(op.recv, data_in(set, op.root, op.bytes), op.bytes);
  }

  // The set the next chunk uses: the sets alternate over every chunk of every operation.
  int next_set() { return static_cast<int>(chunks_++ % 2); }

  void check_peers_alive() const {
    for (int r = 0; r < size_; ++r) {
      const pid_t pid = header()->pids[r].load();
      if (r != rank_ && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
        throw std::runtime_error(fmt::format("rank {} (pid {}) is gone", r, pid));
    }
  }

  int rank_, size_;
  char* base_;
  size_t bytes_;
  size_t chunk_;
  size_t small_allreduce_bytes_;
  std::chrono::milliseconds timeout_;
  uint64_t chunks_ = 0;
  std::vector<size_t> piece_starts_;  // for Pieces
};

size_t segment_bytes(int size) { return kHeaderBytes + 2 * static_cast<size_t>(size + 1) * chunk_bytes(size); }

// Maps the segment `name`; rank 0 creates it (and reserves its memory, so a full /dev/shm is an
// error now rather than a SIGBUS later). Returns nullptr when this rank cannot.
void* map_segment(const std::string& name, size_t bytes, bool create) {
  int fd = ::shm_open(name.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  // A segment made for another number of ranks (members that disagree on a process set's list
  // meet under one key) is not used: its slots lie elsewhere, and past its end is a SIGBUS.
  struct stat made {};
  if (!create && (::fstat(fd, &made) != 0 || static_cast<size_t>(made.st_size) != bytes)) {
    ::close(fd);
    return nullptr;
  }
  if (create && ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED && create) ::shm_unlink(name.c_str());
  return base == MAP_FAILED ? nullptr : base;
}

// Rank 0 removes the segment's name on every way out of the setup (a peer that never comes makes
// the store throw): once all ranks have it mapped, or given up, nobody needs the name.
struct UnlinkOnExit {
  std::string name;
  ~UnlinkOnExit() {
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

}  // namespace

std::unique_ptr<Collectives> make_shared_memory_collectives(int rank, int size, gloo::rendezvous::Store& store,
                                                            std::chrono::milliseconds timeout) {
  if (size < 2 || size > kMaxRanks) return nullptr;
  const size_t bytes = segment_bytes(size);
  std::string name;
  void* base = nullptr;
  UnlinkOnExit name_guard;
  if (rank == 0) {
    name = "/ddl-" + ddl::random_hex(8);
    base = map_segment(name, bytes, true);
    if (base != nullptr) name_guard.name = name;
    store.set("shm/name/0", std::vector<char>(name.begin(), name.end()));
  } else {
    auto value = store.get("shm/name/0");  // keys end in their owner's rank (the PMIx store needs it)
    name.assign(value.begin(), value.end());
    base = map_segment(name, bytes, false);
  }
  // Every rank says whether it mapped the segment; all use it, or none does.
  const char mapped = base != nullptr ? '1' : '0';
  store.set(fmt::format("shm/mapped/{}", rank), std::vector<char>{mapped});
  bool all = true;
  for (int r = 0; r < size; ++r) all = all && store.get(fmt::format("shm/mapped/{}", r)) == std::vector<char>{'1'};
  if (!all) {
    if (base != nullptr) ::munmap(base, bytes);
    return nullptr;
  }
  return std::make_unique<SharedMemory>(rank, size, base, bytes, timeout);
}

}  // namespace ddl::runtime
