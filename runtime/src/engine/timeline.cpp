#include "runtime/src/engine/timeline.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/write_all.hpp"

namespace ddl::runtime {

namespace {
constexpr size_t kWriteBlock = size_t{64} * 1024;

std::string dumped(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

// A path that cannot be written is said once on stderr, naming DDL_TIMELINE, and the run goes on
// without a timeline: the training matters more than its trace.
Timeline::Timeline(const std::string& path, int rank) : rank_(rank) {
  if (path.empty() || open(path)) return;
  const int error = errno;
  std::fprintf(stderr, "ddl: rank %d: DDL_TIMELINE: cannot write %s (%s); no timeline is written\n", rank, path.c_str(),
               std::strerror(error));
}

Timeline::~Timeline() { close(); }

bool Timeline::open(const std::string& path) {
  std::lock_guard lock(mutex_);
  close_locked();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) return false;
  owner_ = ::getpid();
  pending_ = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  rows_.clear();
  first_ = true;
  enabled_ = true;
  return true;
}

void Timeline::close() {
  std::lock_guard lock(mutex_);
  close_locked();
}

void Timeline::close_locked() {
  enabled_ = false;
  if (fd_ < 0) return;
  pending_ += "\n]}\n";
  flush_locked();
  ::close(fd_);  // in a fork()ed child: its own copy of the descriptor only
  fd_ = -1;
}

void Timeline::add(const std::string& text) {
  pending_ += text;
  if (pending_.size() >= kWriteBlock) flush_locked();
}

void Timeline::flush_locked() {
  // A write that fails (a full disk) leaves the trace short; the training goes on.
  if (::getpid() == owner_) (void)write_all(fd_, pending_);
  pending_.clear();
}

int Timeline::row_of(const std::string& op_name) {
  auto [it, added] = rows_.emplace(op_name, static_cast<int>(rows_.size()) + 1);
  if (added) {  // name the row after the op
    nlohmann::json meta = {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", it->second}, {"args", {{"name", op_name}}}};
    add((first_ ? "" : ",\n") + dumped(meta));
    first_ = false;
  }
  return it->second;
}

void Timeline::record(const std::string& op_name, const char* phase, Clock::time_point start, Clock::time_point end) {
  if (!enabled()) return;
  std::lock_guard lock(mutex_);
  if (fd_ < 0) return;
  using us = std::chrono::duration<double, std::micro>;
  int row = row_of(op_name);
  nlohmann::json event = {{"name", phase},
                          {"cat", "ddl"},
                          {"ph", "X"},
                          {"pid", rank_},
                          {"tid", row},
                          {"ts", us(start - origin_).count()},
                          {"dur", us(end - start).count()},
                          {"args", {{"op", op_name}}}};
  add(",\n" + dumped(event));
}

}  // namespace ddl::runtime
