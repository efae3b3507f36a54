#include "launcher/supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/rank_ranges.hpp"
#include "common/write_all.hpp"
#include "launcher/line_splitter.hpp"
#include "launcher/orphan_guard.hpp"
#include "launcher/output_router.hpp"
#include "launcher/relayed_output.hpp"
#include "launcher/run_cgroup.hpp"
#include "launcher/stacks.hpp"
#include "launcher/worker_process.hpp"

namespace ddl::launcher {

using Clock = std::chrono::steady_clock;

namespace {

// Every signal whose default would end ddl: one it did not catch would end it without stopping the
// workers' children (the workers themselves die with it: PR_SET_PDEATHSIG). Each stops the run, the
// workers getting the same signal, except the two below.
constexpr int kHandledSignals[] = {SIGCHLD, SIGINT,    SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT, SIGALRM,
                                   SIGXCPU, SIGVTALRM, SIGPROF, SIGPWR, SIGXFSZ, SIGTSTP, SIGCONT};

// Signals that ask the workers for something (a checkpoint before the time limit: Slurm's
// --signal=B:USR1@300) rather than to stop: passed on, and the run goes on.
bool passed_on_only(int sig) { return sig == SIGUSR1 || sig == SIGUSR2; }

// The stop signals the shell ignores for what it starts with `nohup` (HUP) or `&` in a script
// (INT, QUIT): one ddl was started ignoring stays ignored, as the Unix rule is, rather than stop
// the run a user meant to outlive the logout.
bool ignored_from_the_start(int sig) {
  if (sig != SIGHUP && sig != SIGINT && sig != SIGQUIT) return false;
  struct sigaction current {};
  return ::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

// Processes whose parent is `parent`: orphans of the workers are re-parented to ddl (a subreaper).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", entry->d_name));
    std::string line;
    if (!std::getline(stat, line)) continue;
    auto close_paren = line.rfind(')');
    if (close_paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      children.push_back(static_cast<pid_t>(std::atoi(entry->d_name)));
  }
  ::closedir(proc);
  return children;
}

struct Worker {
  WorkerProcess process;
  int rank = 0;
  bool running = true;
  std::deque<std::string> stderr_tail;
  LineLabeller labeller;
  int interrupt_signal = 0;
  std::function<bool(pid_t, int)> signal_tasks;
  int control_fd = -1;             // write end of a remote shell's stdin, or -1
  std::vector<int> relayed_ranks;  // a host's agent's or a task launcher's ranks
  std::string name;                // what the failure summary calls a launch that is not a worker
  bool group_alive = false;        // its process group (its pid) is its own and not yet found empty
};

// The line on a host agent's stdin that asks it to relay its workers' stacks.
constexpr std::string_view kStacksRequest = "stacks";

// How often libddl's marks of progress are looked at.
constexpr std::chrono::seconds kProgressLook{1};

// How a worker that ended shows in a report of stacks.
std::string ended(int status) {
  if (WIFSIGNALED(status)) return fmt::format("it had ended, killed by signal {}", WTERMSIG(status));
  return fmt::format("it had ended, with exit code {}", WEXITSTATUS(status));
}

// A remote shell still running this long after it was sent SIGKILL for its workers is killed.
constexpr std::chrono::seconds kRemoteKillWait{3};

// A remote shell that has not taken the job (or a signal line) within this long never will.
constexpr std::chrono::seconds kRemoteShellReadWait{20};
constexpr size_t kDefaultPipeBytes = size_t{64} * 1024;        // Linux's
constexpr size_t kLargestUserPipeBytes = size_t{1024} * 1024;  // Linux's default /proc/sys/fs/pipe-max-size

// Writes all of `data` to a pipe, waiting while it is full; false if the reader is gone or has
// not read for kRemoteShellReadWait.
bool write_to_pipe(int fd, std::string_view data) {
  auto deadline = Clock::now() + kRemoteShellReadWait;
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (Clock::now() >= deadline) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n > 0) deadline = Clock::now() + kRemoteShellReadWait;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

class Run {
 public:
  Run(const SupervisorOptions& options, int signal_fd, const sigset_t& child_mask, int early_finish)
      : early_finish_(early_finish),
        options_(options),
        signal_fd_(signal_fd),
        control_fd_(options.control_fd),
        child_mask_(child_mask),
        output_(options, {[this] { note_activity(); }, [this](const backends::TaskLine& task) { take_relayed_stacks(task); },
                          [this](const backends::TaskLine& task) { take_relayed_end(task); }}) {}

  ~Run() {
    for (auto& w : workers_)
      if (w.control_fd >= 0) ::close(w.control_fd);
  }

  RunOutcome execute(const std::vector<WorkerLaunch>& launches) {
    std::vector<std::pair<int, int>> files = output_.open_output_files(launches);  // all before any worker runs
    workers_.reserve(launches.size());  // a worker's stderr tail stays where the output router was told
    // Under a task launcher (parent_signals_workers) the workers share ddl's session and the
    // launcher cleans up; elsewhere each worker's group and session is its own, for the guard to know.
    if (!options_.parent_signals_workers) cgroup_ = RunCgroup::make();
    guard_.emplace(options_.parent_signals_workers ? 0 : launches.size(), options_.grace_period, cgroup_.name(), cgroup_.folder());
    try {
      for (size_t i = 0; i < launches.size(); ++i) start(launches[i], files[i]);
      output_.empty_previous_output(files);  // nothing of the workers' is written before the first step()
    } catch (...) {
      kill_everything();
      guard_->stand_down();
      throw;
    }
    if (options_.hang_timeout) {
      hang_due_ = Clock::now() + *options_.hang_timeout;
      next_progress_look_ = Clock::now() + kProgressLook;
    }
    if (early_finish_) begin_finishing(early_finish_);  // it came before the workers started
    try {
      while (running_workers() > 0) step();
      if (collection_) finish_collection();  // every worker ended meanwhile: the stacks still show
    } catch (...) {
      // ddl itself failed mid-run (an output file, poll): no worker may outlive it.
      signal_all(SIGKILL);
      kill_everything();
      guard_->stand_down();
      throw;
    }
    kill_everything();
    guard_->stand_down();
    cgroup_.remove();
    if (drain_streams(std::chrono::seconds(2), std::chrono::seconds(60))) {
      output_.end_open_lines();
      flush_output();
    }
    note_ranks_that_never_started();
    return outcome();
  }

 private:
  // The hang watchdog (SupervisorOptions::hang_timeout) and the stacks of Ctrl-\.
  struct Collection {
    enum Why { kHang, kQuit } why = kHang;
    Clock::time_point since;           // relayed stacks count from here
    Clock::time_point deadline;        // for the relayed ones
    std::map<int, RankStacks> stacks;  // by rank: own workers' at once, relayed ones as they come
    std::set<int> relayed;             // the ranks whose stacks come relayed
  };
  struct RelayedStacks {
    RankStacks stacks;
    bool complete = false;
    Clock::time_point at;  // when complete
  };

  void start(const WorkerLaunch& launch, std::pair<int, int> files) {
    if (!launch.control_input && !launch.labeller && !watch_) {
      watch_.emplace();
      if (watch_->path().empty() && options_.hang_timeout)
        output_.add(STDERR_FILENO,
                    "ddl: warning: --hang-timeout: no folder could be made under $TMPDIR or /tmp for the workers' "
                    "marks of progress, so only their output counts as progress\n");
    }
    Worker& w = workers_.emplace_back();
    w.rank = launch.rank;
    w.labeller = launch.labeller;
    w.interrupt_signal = launch.interrupt_signal;
    w.signal_tasks = launch.signal_tasks;
    w.relayed_ranks = launch.relayed_ranks;
    w.name = !launch.host.empty() ? launch.host : std::filesystem::path(launch.program).filename().string();
    w.process = launch.control_input ? spawn_with_control(launch, w)
                                     : spawn_worker(launch.program, launch.argv, guarded(launch.env), child_mask_, -1,
                                                    !options_.parent_signals_workers, cgroup_.procs_fd());
    w.group_alive = launch.control_input || !options_.parent_signals_workers;  // a remote shell's session is its own
    if (w.group_alive) guard_->watch(w.process.pid);
    output_.add_worker(launch, w.process.stdout_fd, w.process.stderr_fd, files, &w.stderr_tail, launch.labeller ? &w.labeller : nullptr);
  }

  // A worker's environment with the guard's mark, by which the guard finds what it forked, and
  // the hang watchdog's folder (for a worker, not a task launcher: each task's ddl exec has its own).
  Environment guarded(const Environment& env) const {
    Environment marked = env;
    if (!guard_->marker().empty()) marked[OrphanGuard::kMarkerVariable] = guard_->marker();
    if (watch_) watch_->add_to(marked);
    return marked;
  }

  // A remote shell: its stdin is a pipe that carries the job first, then signals.
  WorkerProcess spawn_with_control(const WorkerLaunch& launch, Worker& w) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw open_failure("cannot create a pipe for a host's agent", errno);
    WorkerProcess process;
    try {
      process = spawn_worker(launch.program, launch.argv, launch.env, child_mask_, fds[0], true, cgroup_.procs_fd());
    } catch (...) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw;
    }
    ::close(fds[0]);
    w.control_fd = fds[1];
    ::fcntl(w.control_fd, F_SETFL, O_NONBLOCK);
    // A pipe that holds the whole job takes it at once, whenever the shell reads it: a job larger
    // than the default 64 KiB (an Lmod environment) would otherwise be written host after host, each
    // waiting for its ssh to connect, with Ctrl-C unread meanwhile. Up to pipe-max-size (1 MiB for
    // a user); a larger job is written as it is read.
    if (const size_t job = launch.control_input->size(); job >= kDefaultPipeBytes)
      ::fcntl(w.control_fd, F_SETPIPE_SZ, static_cast<int>(std::min<size_t>(job + 1, kLargestUserPipeBytes)));
    // A shell that fails to connect reads none of it and exits; one that neither reads nor exits
    // is killed (its launch then fails like any other).
    if (!write_to_pipe(w.control_fd, *launch.control_input)) signal_unreaped_worker(process.pid, SIGKILL);
    return process;
  }

  int running_workers() const {
    int n = 0;
    for (const auto& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  // Waits for output, a signal, the kill deadline or the time to show an unfinished line, and
  // handles what came. ddl's output is written only as its reader takes it (OutputRouter): one
  // that has stopped reading holds up the workers' output, never the signals or a failed worker.
  void step() {
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}, {control_fd_, POLLIN, 0}, {output_.pending_fd(), POLLOUT, 0}};
    output_.add_open_pipes(fds);
    int rc = ::poll(fds.data(), fds.size(), ms_until_next_deadline());
    if (rc < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
    if (fds[2].revents != 0) output_.write_pending();
    output_.read_ready_pipes(fds, 3);
    if (fds[0].revents & POLLIN) handle_signals();
    if (fds[1].revents != 0) read_control();
    output_.show_quiet_unfinished_lines();
    watch_for_hangs();
    if (finish_deadline_ && Clock::now() >= *finish_deadline_) stop_workers_that_overran();
    if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
      escalated_ = true;
      signal_all(SIGKILL);
      kill_deadline_.reset();
    }
    if (remote_kill_deadline_ && Clock::now() >= *remote_kill_deadline_) {
      for (const auto& w : workers_)
        if (w.control_fd >= 0 || w.signal_tasks) signal_worker(w, SIGKILL);
      remote_kill_deadline_.reset();
    }
    if (reap_due_) {
      reap_due_ = false;
      reap_children();
    }
  }

  // The watchdog is off once the run stops, and after the finish signal: the workers save,
  // quietly perhaps, until that signal's own deadline.
  bool watches_for_hangs() const { return options_.hang_timeout && !stopping_ && !finished_on_; }

  int ms_until_next_deadline() const {
    std::optional<Clock::time_point> next = kill_deadline_;
    auto consider = [&](const std::optional<Clock::time_point>& t) {
      if (t && (!next || *t < *next)) next = t;
    };
    consider(remote_kill_deadline_);
    consider(next_progress_look_);
    consider(finish_deadline_);
    if (watches_for_hangs()) consider(hang_due_);
    if (collection_) consider(collection_->deadline);
    consider(output_.next_unfinished_due());
    if (!next) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
    return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms + 1, INT_MAX));
  }

  // The launching host's word (an agent's stdin): "signal N" lines; the end means it is gone.
  void read_control() {
    char buf[256];
    ssize_t n = ::read(control_fd_, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      control_fd_ = -1;  // poll ignores it from now on; the owner closes it
      on_external_signal(SIGHUP);
      return;
    }
    control_splitter_.feed(std::string_view(buf, static_cast<size_t>(n)), [&](std::string_view line, char) {
      if (line == kStacksRequest) return relay_own_stacks();
      int sig = 0;
      if (std::sscanf(std::string(line).c_str(), "signal %d", &sig) != 1 || sig < 1 || sig >= NSIG) return;
      if (sig == SIGKILL) {
        escalated_ = true;
        signal_all(SIGKILL);
      } else if (sig == SIGSTOP) {  // the launching host's ddl was stopped (Ctrl-Z)
        pause_workers();
      } else if (sig == SIGCONT) {
        resume_workers();
      } else if (passed_on_only(sig)) {
        signal_running(sig);
      } else {
        on_external_signal(sig);
      }
    });
  }

  // Output, a relayed line or a libddl op: the run is not hung.
  void note_activity() {
    last_activity_ = Clock::now();
    if (options_.hang_timeout) hang_due_ = last_activity_ + *options_.hang_timeout;
  }

  // The hang watchdog's turn in each step: libddl's marks of progress once a second, relayed
  // stacks that completed a collection, and the quiet that makes a hang.
  void watch_for_hangs() {
    if (output_.output_full()) note_activity();  // the workers wait for ddl's reader, not the other way round
    if (paused_) note_activity();                // stopped (Ctrl-Z) on purpose
    const auto now = Clock::now();
    if (next_progress_look_ && now >= *next_progress_look_) look_at_progress();
    if (collection_ && (now >= collection_->deadline || collection_complete())) finish_collection();
    if (!watches_for_hangs() || collection_ || now < hang_due_) return;
    hang_due_ = now + *options_.hang_timeout;  // the next report, should the quiet go on
    if (options_.relay_with_rank_labels)
      relay_own_stacks();
    else
      start_collection(Collection::kHang);
  }

  // New marks of progress are activity; a relaying supervisor relays one of them.
  void look_at_progress() {
    next_progress_look_ = Clock::now() + kProgressLook;
    if (!watch_) return;
    std::optional<int> progressed;
    for (const auto& [rank, time] : watch_->progress()) {
      auto& seen = progress_seen_[rank];
      if (time == seen) continue;
      seen = time;
      if (!progressed) progressed = rank;
    }
    if (!progressed) return;
    note_activity();
    if (!options_.relay_with_rank_labels) return;
    output_.add(STDOUT_FILENO, relayed_progress(*progressed));
    output_.write_pending();
  }

  // The stacks of this supervisor's own workers (not hosts' agents or a task launcher): a worker
  // that ended says so.
  std::map<int, RankStacks> own_stacks() {
    std::map<int, pid_t> running;
    std::map<int, RankStacks> stacks;
    for (const auto& w : workers_) {
      if (w.control_fd >= 0 || w.labeller) continue;
      if (w.running)
        running[w.rank] = w.process.pid;
      else
        stacks[w.rank].none_because = ended(wait_status_[w.rank]);
    }
    if (!running.empty()) stacks.merge(collect_stacks(watch_ ? watch_->path() : "", running, kPythonDumpWait, kNativeStackWait));
    return stacks;
  }

  // A relaying supervisor's report: its workers' stacks, relayed for the launching host.
  void relay_own_stacks() {
    for (const auto& [rank, stacks] : own_stacks()) output_.add(STDOUT_FILENO, relayed_stacks(rank, stacks.text, stacks.none_because));
    output_.write_pending();
  }

  // Ctrl-\: the stacks, then the run stops as SIGQUIT asks (or goes on, with --hang-action report).
  // A relaying supervisor relays its workers' stacks and goes on: the launching host decides.
  void on_quit_signal() {
    if (options_.relay_with_rank_labels) return relay_own_stacks();
    if (collection_)  // a second Ctrl-\ does not wait for the stacks
      return on_external_signal(SIGQUIT);
    start_collection(Collection::kQuit);
  }

  // Own workers' stacks at once; stacks relayed by hosts' agents or tasks (which relay them after
  // each timeout of quiet, or when asked) as they come, until all are in or kRelayedStacksWait.
  // A host's agent is asked; a task launcher's tasks relay theirs only after a quiet of their own
  // (they know no way to be asked), so without --hang-timeout none come from them.
  void start_collection(Collection::Why why) {
    const auto now = Clock::now();
    Collection c;
    c.why = why;
    c.stacks = own_stacks();
    bool asked = false;
    for (const auto& w : workers_) {
      if (w.relayed_ranks.empty()) continue;
      const char* gone = w.labeller ? "the task launcher had ended" : "its host's agent had ended";
      const bool will_relay = w.running && (w.control_fd >= 0 || options_.hang_timeout);
      for (int rank : w.relayed_ranks) {
        if (will_relay)
          c.relayed.insert(rank);
        else
          c.stacks[rank].none_because = w.running ? "under srun or mpirun, stacks come only after a quiet of --hang-timeout" : gone;
      }
      if (why == Collection::kQuit && w.running && w.control_fd >= 0)
        asked |= write_to_pipe(w.control_fd, fmt::format("{}\n", kStacksRequest));
    }
    // Relayed stacks count from the start of the quiet (those of an earlier report excepted), or
    // from the request when the agents were asked.
    c.since = asked ? now : std::max(last_activity_, last_collection_);
    c.deadline = c.relayed.empty() ? now : now + kRelayedStacksWait;
    last_collection_ = now;
    collection_ = std::move(c);
  }

  // A relayed line of a rank's stacks, or their end.
  void take_relayed_stacks(const backends::TaskLine& task) {
    RelayedStacks& r = relayed_dumps_[task.rank];
    if (r.complete) r = RelayedStacks{};  // a new dump begins
    if (task.notice == backends::TaskLine::Notice::kStack) {
      r.stacks.text += task.text + "\n";
      return;
    }
    r.complete = true;
    r.at = Clock::now();
    r.stacks.none_because = task.text;
  }

  // A task launcher's rank whose task ended with 0 after a stop or finish signal, though its
  // program did not (ddl exec --relay, so that srun does not kill the ranks still saving): its
  // failure, when the signal was not ddl's own stop or the run's finish.
  void take_relayed_end(const backends::TaskLine& task) {
    int status = 0;
    const char* end = task.text.data() + task.text.size();
    auto [stop, error] = std::from_chars(task.text.data(), end, status);
    if (error != std::errc{} || stop != end || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) return;
    if (interrupted_by_ || hung_ || finished_on_ || failure_) return;
    auto relaying = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) {
      return std::find(w.relayed_ranks.begin(), w.relayed_ranks.end(), task.rank) != w.relayed_ranks.end();
    });
    if (relaying == workers_.end()) return;
    record_failure(*relaying, status);
    failure_->rank = task.rank;
    failure_->host = output_.host_of(task.rank, options_.host);
    failure_->told_by_relay = true;
    failure_time_ = Clock::now();
    // The requeue signal sent to the tasks alone (--signal=USR1 without B:): the run did not get it,
    // and fails, but the others got it too and may be saving: they end by themselves.
    if (WIFSIGNALED(status) && is_finish_signal(WTERMSIG(status))) return;
    if (options_.stop_on_failure && !stopping_) {
      stopped_for_relayed_end_ = true;
      begin_stopping(SIGTERM);
    }
  }

  bool fresh(int rank) const {
    auto it = relayed_dumps_.find(rank);
    return it != relayed_dumps_.end() && it->second.complete && it->second.at >= collection_->since;
  }

  bool collection_complete() const {
    return std::all_of(collection_->relayed.begin(), collection_->relayed.end(), [&](int rank) { return fresh(rank); });
  }

  void finish_collection() {
    for (int rank : collection_->relayed) {
      if (fresh(rank))
        collection_->stacks[rank] = relayed_dumps_[rank].stacks;
      else
        collection_->stacks[rank].none_because = fmt::format("its host sent none within {} s", kRelayedStacksWait.count());
    }
    const Collection c = std::move(*collection_);
    collection_.reset();
    report_stacks(c);
  }

  // Shows the stacks (and keeps them in --output-dir), then acts: a hang stops the run, and SIGQUIT
  // (Ctrl-\) stops it as that signal does; with --hang-action report neither does.
  void report_stacks(const Collection& c) {
    const std::string header =
        c.why == Collection::kHang
            ? fmt::format(
                  "ddl: no worker has written output or completed a libddl op for {} s (--hang-timeout); the stacks of every "
                  "rank:\n",
                  std::chrono::duration_cast<std::chrono::seconds>(*options_.hang_timeout).count())
            : "ddl: SIGQUIT: the stacks of every rank:\n";
    const std::string report = header + stacks_report(c.stacks);
    output_.report(report);
    output_.write_pending();
    save_report(report);
    if (options_.hang_report_only || stopping_) return;  // a failure or a signal already stops the run
    if (c.why == Collection::kQuit) return on_external_signal(SIGQUIT);
    if (finished_on_) return;  // the finish signal came meanwhile: the workers save, until its deadline
    hung_ = true;
    begin_stopping(SIGTERM);
  }

  void save_report(const std::string& report) {
    if (options_.output_dir.empty()) return;
    const std::string path = options_.output_dir + "/stacks.txt";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const std::time_t now = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    if (fd < 0 || !write_all(fd, fmt::format("# {}\n{}\n", when, report)))
      output_.add(STDERR_FILENO, fmt::format("ddl: warning: --output-dir: cannot write {}: {}\n", path, std::strerror(errno)));
    if (fd >= 0) ::close(fd);
  }

  void handle_signals() {
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD)
        reap_children();
      else if (sig == SIGTSTP)
        stop_job();
      else if (sig == SIGCONT)
        resume_workers();
      else if (options_.parent_signals_workers && static_cast<pid_t>(info.ssi_pid) == ::getppid())
        note_signal_the_workers_got(sig);
      else if (is_finish_signal(sig))
        begin_finishing(sig);
      else if (passed_on_only(sig))
        signal_running(sig);
      else if (sig == SIGQUIT && !stopping_)
        on_quit_signal();
      else
        on_external_signal(sig);
    }
  }

  void reap_children() {
    // Workers found dead together: a rank killed by a signal is more likely the cause than a rank
    // that exited with an error because its peer vanished, so it is considered first.
    std::vector<std::pair<Worker*, int>> failed;
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (guard_) guard_->child_reaped(pid);
      for (auto& w : workers_) {
        if (w.process.pid != pid || !w.running) continue;
        w.running = false;
        if (guard_ && w.group_alive) guard_->worker_reaped(pid);
        wait_status_[w.rank] = status;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failed.emplace_back(&w, status);
        break;
      }
    }
    note_groups_gone();
    std::stable_partition(failed.begin(), failed.end(), [](const auto& f) { return WIFSIGNALED(f.second); });
    for (const auto& [w, st] : failed) on_worker_failed(*w, st);
  }

  // A reaped worker's group lives on while anything it forked stays in it. Once it is empty its id
  // may become another process's group (pid reuse): ddl must not signal it again. What empties it
  // is nearly always ddl reaping its last member (they are re-parented to ddl), so checking after
  // each reaping is in time. (The guard goes by the worker's session too, which can outlive the
  // group; it is told of the reaping and checks for reuse itself.)
  void note_groups_gone() {
    for (auto& w : workers_) {
      if (w.running || !w.group_alive || ::kill(-w.process.pid, 0) == 0 || errno != ESRCH) continue;
      w.group_alive = false;
    }
  }

  void on_worker_failed(const Worker& w, int status) {
    // Stopped from outside, as hung, or asked to finish: not a worker's failure.
    if (interrupted_by_ || hung_ || finished_on_) return;
    if (failure_ && failure_->told_by_relay && !escalated_ &&
        std::find(w.relayed_ranks.begin(), w.relayed_ranks.end(), failure_->rank) != w.relayed_ranks.end()) {
      // The relayed end may be a rank's death of the signal its launcher sent when another task
      // failed (srun's --kill-on-bad-exit, mpirun's abort): the launcher's report names the cause,
      // and where it names none, the relayed end stands (WorkerFailure::relayed). Not after ddl's
      // own SIGKILL, which the launcher would report as a task's failure.
      const WorkerFailure relayed = *failure_;
      record_failure(w, status);
      failure_->relayed = std::make_shared<WorkerFailure>(relayed);
      return;
    }
    if (failure_) {
      // A worker killed by a signal that ddl did not send, just after a worker exited with an
      // error, is the likelier cause: its peers often exit first, on the broken connection.
      const bool signal_from_ddl = WIFSIGNALED(status) && (WTERMSIG(status) == SIGTERM || (escalated_ && WTERMSIG(status) == SIGKILL));
      const bool soon = Clock::now() - failure_time_ < kRootCauseWindow;
      if (failure_->signal == 0 && WIFSIGNALED(status) && !signal_from_ddl && soon) record_failure(w, status);
      return;
    }
    record_failure(w, status);
    failure_time_ = Clock::now();
    if (options_.stop_on_failure) begin_stopping(SIGTERM);
  }

  // A task launcher or host's agent that exited with 0 although some of its ranks never started
  // (srun 22.05 does, when slurmstepd fails to launch the step) failed: each rank's relay names its
  // host first thing, so a rank that never did so never ran.
  void note_ranks_that_never_started() {
    if (failure_ || interrupted_by_ || hung_ || finished_on_) return;
    for (const auto& w : workers_) {
      if (!w.labeller || w.relayed_ranks.empty() || w.running) continue;
      std::vector<int> missing;
      for (int rank : w.relayed_ranks)
        if (!output_.knows_host_of(rank)) missing.push_back(rank);
      if (missing.empty()) continue;
      WorkerFailure f;
      f.description =
          fmt::format("{} exited with 0, but rank(s) {} never started (its messages above may say why)", w.name, rank_ranges(missing));
      f.never_started = missing;
      f.rank = -1;
      f.host = w.name;
      f.exit_code = 1;
      failure_ = f;
      failed_worker_ = &w;
      return;
    }
  }

  void record_failure(const Worker& w, int status) {
    WorkerFailure f;
    f.rank = w.rank;
    f.host = options_.host;
    f.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    f.exit_code = f.signal ? 128 + f.signal : WEXITSTATUS(status);
    failure_ = f;
    failed_worker_ = &w;
  }

  // The launcher signalled every process of the task itself: the run stops (unless the signal
  // asks for something else) without ddl signalling the workers again or killing them later.
  void note_signal_the_workers_got(int sig) {
    if (is_finish_signal(sig) && !finished_on_ && !stopping_) finished_on_ = sig;  // a worker's end is no failure from here on
    if (passed_on_only(sig)) return;
    if (!signalled_) signalled_ = sig;
    if (stopping_) return;
    if (!failure_) interrupted_by_ = sig;
    stopping_ = true;
    workers_stopped_ = running_workers();
  }

  void on_external_signal(int sig) {
    if (!signalled_) signalled_ = sig;
    if (stopping_ && stopped_for_relayed_end_ && !escalated_) {
      // That end was this same stop reaching a task first (scancel of the job, its time limit): the
      // run was interrupted, not failed, and the workers keep their grace.
      stopped_for_relayed_end_ = false;
      failure_.reset();
      failed_worker_ = nullptr;
      interrupted_by_ = sig;
      return;
    }
    if (stopping_) {  // a second Ctrl-C: no more waiting
      escalated_ = true;
      signal_all(SIGKILL);
      return;
    }
    if (!options_.stop_on_failure) failure_.reset();  // a failure that stopped nothing: the signal stops the run
    if (!failure_) interrupted_by_ = sig;
    begin_stopping(sig);
  }

  // The finish signal (SupervisorOptions::finish_on): the workers get it and have until the
  // deadline to end by themselves; the first one is what counts.
  void begin_finishing(int sig) {
    if (finished_on_) return;
    finished_on_ = sig;
    // A rank's relay said it died of this signal, which reached it first: the finish, not a failure.
    if (failure_ && failure_->told_by_relay && failure_->signal == sig) {
      failure_.reset();
      failed_worker_ = nullptr;
    }
    if (stopping_) return;  // a failure or a signal stops the run already: noted only
    finish_began_ = Clock::now();
    signal_running(sig);
    finish_deadline_ = options_.finish_on->deadline(finish_began_);
    // The deadline asks squeue for the time left (backends::run_command), whose SIGCHLD handling
    // drops a SIGCHLD pending meanwhile: workers that ended by then are found here, or never.
    reap_children();
  }

  bool is_finish_signal(int sig) const { return options_.finish_on && sig == options_.finish_on->signal; }

  void stop_workers_that_overran() {
    finish_deadline_.reset();
    if (stopping_ || running_workers() == 0) return;
    workers_overran_ = true;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - finish_began_).count();
    output_.add(STDERR_FILENO, fmt::format("ddl: workers still running {} s after SIG{} (their time to save and end): stopping them\n",
                                           waited, ::sigabbrev_np(finished_on_)));
    begin_stopping(SIGTERM);
  }

  void begin_stopping(int sig) {
    if (stopping_) return;
    stopping_ = true;
    workers_stopped_ = running_workers();
    signal_all(sig);
    // A stopped worker (SIGSTOP, Ctrl-Z) acts on it now, not at the SIGKILL (a host's agent does
    // this for its own; a task launcher whose tasks are signalled through the scheduler passes it
    // on, and is sent it only when ddl stopped them).
    for (const auto& w : workers_)
      if (w.control_fd < 0 && (!w.signal_tasks || paused_)) signal_worker(w, SIGCONT);
    kill_deadline_ = Clock::now() + options_.grace_period;
  }

  // Signals each worker's whole process group (what it forked too). A task launcher that wants
  // another signal to stop its tasks gets that one instead of SIGINT.
  // A remote shell gets the signal as a line for its agent to deliver.
  void signal_all(int sig) {
    for (const auto& w : workers_) {
      const int to_send = sig == SIGINT && w.interrupt_signal ? w.interrupt_signal : sig;
      if (w.signal_tasks && w.running && signal_tasks_of(w, sig)) continue;
      if (w.control_fd < 0) {
        signal_worker(w, to_send);
        continue;
      }
      if (!w.running) continue;
      if (!write_to_pipe(w.control_fd, fmt::format("signal {}\n", to_send)) || to_send == SIGKILL) {
        if (!remote_kill_deadline_) remote_kill_deadline_ = Clock::now() + kRemoteKillWait;
      }
    }
  }

  // A task launcher's tasks, signalled through the scheduler (WorkerLaunch::signal_tasks). For
  // SIGKILL the launcher follows after kRemoteKillWait; if the scheduler did not take the SIGKILL,
  // the launcher is told to stop its tasks itself (srun kills them at once) in the meantime.
  bool signal_tasks_of(const Worker& w, int sig) {
    const bool sent = w.signal_tasks(w.process.pid, sig);
    reap_due_ = true;  // the scheduler's command may have taken a SIGCHLD (backends::run_command)
    if (sig != SIGKILL) return sent;
    if (!sent) signal_worker(w, w.interrupt_signal ? w.interrupt_signal : SIGKILL);
    if (!remote_kill_deadline_) remote_kill_deadline_ = Clock::now() + kRemoteKillWait;
    return true;
  }

  // A worker's process group; the worker itself too while it is not reaped (see
  // signal_unreaped_worker). A reaped one's group may live on (what it forked).
  static bool signal_worker(const Worker& w, int sig) {
    if (w.process.pid <= 0) return false;  // its start failed: there is nothing to signal
    if (w.running) return signal_unreaped_worker(w.process.pid, sig);
    return w.group_alive && ::kill(-w.process.pid, sig) == 0;
  }

  void signal_running(int sig) {
    for (const auto& w : workers_) {
      if (!w.running) continue;
      if (w.control_fd >= 0)
        write_to_pipe(w.control_fd, fmt::format("signal {}\n", sig));
      else
        signal_worker(w, sig);
    }
  }

  // Ctrl-Z (SIGTSTP): every worker stops, then ddl itself, so that the shell's job is stopped whole
  // (the workers run in sessions of their own, which the terminal's SIGTSTP does not reach). `fg`
  // or `kill -CONT` continues ddl, whose SIGCONT then resumes them (resume_workers). A run already
  // stopping does not stop: its workers are finishing.
  void stop_job() {
    if (stopping_) return;
    pause_workers();
    ::raise(SIGSTOP);
  }

  // Workers on this host get SIGSTOP (which they cannot ignore), their whole process groups; a
  // host's agent is told to do so; a task launcher (srun, mpirun) gets SIGTSTP and stops its tasks
  // as it does (mpirun stops them; srun as its version and site allow).
  void pause_workers() {
    paused_ = true;
    for (const auto& w : workers_) {
      if (!w.running) continue;
      if (w.control_fd >= 0)
        write_to_pipe(w.control_fd, fmt::format("signal {}\n", SIGSTOP));
      else
        signal_worker(w, w.labeller ? SIGTSTP : SIGSTOP);
    }
  }

  // Only workers that ddl stopped: Slurm sends SIGCONT with each signal to the batch shell (ddl),
  // and srun would say "got SIGCONT" for each.
  void resume_workers() {
    note_activity();  // the time stopped is no quiet of the workers'
    if (!paused_) return;
    paused_ = false;
    signal_running(SIGCONT);
  }

  // After the last worker: whatever they left behind (in their groups, or re-parented to ddl).
  void kill_everything() {
    for (int attempt = 0; attempt < 200; ++attempt) {
      bool any = false;
      for (const auto& w : workers_) any |= signal_worker(w, SIGKILL);
      for (pid_t child : children_of(::getpid())) {
        if (guard_ && child == guard_->pid()) continue;  // it stands down after this
        any = true;
        ::kill(-child, SIGKILL);
        ::kill(child, SIGKILL);
      }
      reap_children();
      if (!any) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // Reads what the workers wrote before they ended, to each stream's end. A slow reader of ddl's
  // output can leave much of it in the pipes: the wait ends only after `quiet` with nothing to read
  // (a process that escaped and holds a pipe open), or at `longest`; time spent waiting for ddl's
  // reader to take what is pending is not quiet. Then whatever a stream still holds (a last line
  // without its end) goes out. False when a signal to stop came meanwhile: the output is given up.
  bool drain_streams(std::chrono::milliseconds quiet, std::chrono::milliseconds longest) {
    const auto give_up = Clock::now() + longest;
    auto deadline = std::min(give_up, Clock::now() + quiet);
    for (;;) {
      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}, {output_.pending_fd(), POLLOUT, 0}};
      output_.add_open_pipes(fds);
      if (!output_.any_pipe_open()) break;
      const bool reading = fds.size() > 2;  // else too much waits for ddl's reader
      if (reading && Clock::now() >= deadline) break;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (::poll(fds.data(), fds.size(), reading ? static_cast<int>(std::max<long long>(left, 0)) : -1) < 0 && errno != EINTR) break;
      if (fds[0].revents & POLLIN) {
        if (const int sig = stop_signal_arrived()) {
          give_up_output(sig);
          return false;
        }
      }
      if (fds[1].revents != 0) output_.write_pending();
      bool read_any = !reading && fds[1].revents != 0;  // the reader took some: not a quiet time
      if (output_.read_ready_pipes(fds, 2)) read_any = true;
      if (read_any) deadline = std::min(give_up, Clock::now() + quiet);
    }
    output_.end_all_pipes();
    return true;
  }

  // Writes what is pending as the reader takes it, however slowly, until a signal says to stop.
  void flush_output() {
    while (!output_.output_empty()) {
      pollfd fds[] = {{signal_fd_, POLLIN, 0}, {output_.pending_fd(), POLLOUT, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[0].revents & POLLIN) {
        if (const int sig = stop_signal_arrived()) return give_up_output(sig);
      }
      if (fds[1].revents != 0) output_.write_pending();
    }
  }

  // After the workers: a signal that stops ddl, if one came (the workers' SIGCHLD, the signals
  // only passed on to them, SIGCONT and a Ctrl-Z, which stops ddl until it is continued, do not);
  // else 0.
  int stop_signal_arrived() {
    int stop = 0;
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD)
        reap_children();
      else if (sig == SIGTSTP)
        ::raise(SIGSTOP);
      else if (sig == SIGCONT)
        continue;
      else if (is_finish_signal(sig) && !finished_on_ && failure_)
        finished_on_ = sig;  // the workers failed: to be requeued, not restarted (those that all ended well are done)
      else if (!passed_on_only(sig) && stop == 0)
        stop = sig;
    }
    return stop;
  }

  // `sig` came while ddl waited for its reader: the output not yet taken is dropped, and a run that
  // had not failed ends as interrupted (its output was not all delivered).
  void give_up_output(int sig) {
    output_.give_up();
    output_given_up_ = true;
    if (!signalled_) signalled_ = sig;
    if (!failure_ && !interrupted_by_) interrupted_by_ = sig;
  }

  RunOutcome outcome() {
    RunOutcome o;
    o.interrupted_by = interrupted_by_;
    o.signalled = signalled_;
    o.workers_stopped = workers_stopped_;
    o.wait_status = wait_status_;
    o.output_given_up = output_given_up_;
    o.reader_gone = output_.reader_gone();
    if (hung_) o.hung_after = options_.hang_timeout;
    o.finished_on = interrupted_by_ ? 0 : finished_on_;
    o.workers_overran = workers_overran_;
    if (failure_) {
      o.failure = failure_;
      if (failure_->never_started.empty())  // else its launcher's lines, shown already
        o.failure->stderr_tail.assign(failed_worker_->stderr_tail.begin(), failed_worker_->stderr_tail.end());
      o.exit_code = failure_->exit_code;
    } else if (interrupted_by_) {
      o.exit_code = 128 + interrupted_by_;
    } else if (hung_) {
      o.exit_code = kHangExitCode;
    }
    return o;
  }

  int early_finish_;  // the finish signal, when it came before run() (Supervisor::signal_before_run)
  const SupervisorOptions& options_;
  int signal_fd_;
  int control_fd_;  // the launching host's control lines (an agent's stdin), -1 when none or ended
  LineSplitter control_splitter_;
  std::optional<Clock::time_point> remote_kill_deadline_;
  const sigset_t& child_mask_;
  std::vector<Worker> workers_;
  RunCgroup cgroup_;  // the workers' own cgroup, where the system offers one (before guard_: the guard is told of it)
  std::optional<OrphanGuard> guard_;
  OutputRouter output_;  // the workers' output, and ddl's own
  bool stopping_ = false;
  int workers_stopped_ = 0;
  int interrupted_by_ = 0;
  int signalled_ = 0;  // RunOutcome::signalled
  std::map<int, int> wait_status_;
  std::optional<WorkerFailure> failure_;
  const Worker* failed_worker_ = nullptr;
  std::optional<Clock::time_point> kill_deadline_;
  Clock::time_point failure_time_;
  bool escalated_ = false;                // ddl has sent SIGKILL
  bool stopped_for_relayed_end_ = false;  // the stop began with a relayed end (take_relayed_end), before any signal
  bool reap_due_ = false;                 // a scheduler's command ran: a SIGCHLD may be lost
  bool output_given_up_ = false;
  static constexpr std::chrono::milliseconds kRootCauseWindow{500};

  std::optional<WatchDir> watch_;  // the folder this supervisor's workers leave signs of life in
  Clock::time_point last_activity_ = Clock::now();
  Clock::time_point hang_due_;
  std::optional<Clock::time_point> next_progress_look_;
  std::map<int, std::filesystem::file_time_type> progress_seen_;
  std::optional<Collection> collection_;
  std::map<int, RelayedStacks> relayed_dumps_;
  Clock::time_point last_collection_{};  // when the last collection began
  bool paused_ = false;                  // the workers were stopped (Ctrl-Z) and not yet resumed
  bool hung_ = false;
  int finished_on_ = 0;  // the finish signal that came, if one did
  Clock::time_point finish_began_;
  std::optional<Clock::time_point> finish_deadline_;
  bool workers_overran_ = false;
};

}  // namespace

void hold_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int held = ::open("/dev/null", O_RDWR);  // the lowest free number: this one
    if (held >= 0 && held != fd) {
      ::dup2(held, fd);
      ::close(held);
    }
  }
}

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : kHandledSignals)
    if (!ignored_from_the_start(sig)) sigaddset(&handled, sig);
  ::pthread_sigmask(SIG_BLOCK, &handled, &original_mask_);
  // Workers start with the mask ddl was given, less the finish signal, which ddl itself keeps
  // blocked for the whole run (HeldSignal): inherited blocked, a worker's handler never ran.
  worker_mask_ = original_mask_;
  if (options_.finish_on) sigdelset(&worker_mask_, options_.finish_on->signal);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher while workers run
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  signal_fd_ = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw Error(fmt::format("cannot create a signalfd: {}", std::strerror(errno)));
}

Supervisor::~Supervisor() {
  ::close(signal_fd_);
  ::pthread_sigmask(SIG_SETMASK, &original_mask_, nullptr);
}

RunOutcome stopped_before_start(int sig) {
  RunOutcome outcome;
  outcome.exit_code = 128 + sig;
  outcome.interrupted_by = outcome.signalled = sig;
  return outcome;
}

int Supervisor::signal_before_run() {
  signalfd_siginfo info{};
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGTSTP) ::raise(SIGSTOP);                                              // Ctrl-Z before any worker: ddl alone stops
    if (options_.finish_on && sig == options_.finish_on->signal) early_finish_ = sig;  // for the workers, once they run
    if (sig != SIGCHLD && sig != SIGTSTP && sig != SIGCONT && !passed_on_only(sig)) return sig;
  }
  return 0;
}

RunOutcome Supervisor::run(const std::vector<WorkerLaunch>& workers) {
  Run run(options_, signal_fd_, worker_mask_, early_finish_);
  return run.execute(workers);
}

}  // namespace ddl::launcher
