// Every rank's stacks, for the hang watchdog and Ctrl-\ (SIGQUIT) to `ddl run`, and the folder
// where workers leave what it needs (common/worker_contract.hpp, kWatchDir): libddl's marks of
// progress, and the files of Python processes whose faulthandler ddl's start-up hook registered for
// kStacksSignal. Processes without such a file get gdb's backtrace, where gdb is installed and may
// attach.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

// The signal that asks a registered Python process for its stacks (a real-time one, whose default
// would end a process: only processes that registered are sent it).
int stacks_signal();

class WatchDir {
 public:
  // A new folder under $TMPDIR (or /tmp where that fails), removed with everything in it by the
  // destructor. When none can be made, path() is empty and the workers get no variables (the watchdog then goes by
  // their output alone, and stacks come from gdb only).
  WatchDir();
  ~WatchDir();
  WatchDir(const WatchDir&) = delete;
  WatchDir& operator=(const WatchDir&) = delete;

  const std::string& path() const { return path_; }
  // DDL_WATCH_DIR and DDL_STACKS_SIGNAL for a worker (nothing when there is no folder).
  void add_to(Environment& env) const;
  // The newest progress mark of each rank that left one.
  std::map<int, std::filesystem::file_time_type> progress() const;

 private:
  std::string path_;
};

// What could be learnt of one rank's stacks: the text, or why there is none.
struct RankStacks {
  std::string text;
  std::string none_because;
};

// The stacks of the processes of `workers` (rank -> the worker's pid): each Python process of the
// rank that registered in `watch_dir` (the worker, or a Python program it started) is signalled and
// its dump read back, within `python_wait`; a rank with none gets gdb's backtrace of the worker,
// within `native_wait`. Blocks for up to both.
std::map<int, RankStacks> collect_stacks(const std::string& watch_dir, const std::map<int, pid_t>& workers,
                                         std::chrono::milliseconds python_wait, std::chrono::milliseconds native_wait);

// The stacks as ddl prints them: ranks with identical stacks together ("ranks 0-6, 8-15: in step
// (train.py:40)", then the stack once), thread ids and addresses left out; every line starts with
// `indent` or "ddl: ".
std::string stacks_report(const std::map<int, RankStacks>& stacks);

}  // namespace ddl::launcher
