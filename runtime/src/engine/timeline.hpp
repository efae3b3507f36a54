// DDL_TIMELINE: a Chrome-trace JSON file (chrome://tracing, Perfetto) with one row per op name and
// one event per phase of each op (negotiate, memcpy into the fusion buffer, the collective, memcpy
// out). Written by the engine thread; open() and close() may come from any thread (start_timeline).
// Op names are the program's bytes: any that are not UTF-8 are written with U+FFFD in their place.
// The file is written only by the process that opened it: a fork()ed child (which inherits the
// object, and runs the exit handlers that close it) writes nothing, so the parent's file stays whole.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace ddl::runtime {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  Timeline() = default;
  // Opens `path` for writing; an empty path disables the timeline.
  Timeline(const std::string& path, int rank);
  ~Timeline();  // closes the JSON document
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void record(const std::string& op_name, const char* phase, Clock::time_point start, Clock::time_point end);
  // Starts a new document at `path` (closing any open one); false if the file cannot be written.
  bool open(const std::string& path);
  void close();

 private:
  int row_of(const std::string& op_name);
  void close_locked();
  void add(const std::string& text);  // to the file, through pending_
  void flush_locked();

  std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  int fd_ = -1;
  pid_t owner_ = 0;      // the process that opened fd_
  std::string pending_;  // written out in blocks, and at close
  int rank_ = 0;
  Clock::time_point origin_ = Clock::now();
  std::map<std::string, int> rows_;
  bool first_ = true;
};

}  // namespace ddl::runtime
