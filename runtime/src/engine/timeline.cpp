#include "runtime/src/engine/timeline.hpp"

#include <nlohmann/json.hpp>

namespace ddl::runtime {

Timeline::Timeline(const std::string& path, int rank) : rank_(rank) {
  if (!path.empty()) open(path);
}

Timeline::~Timeline() { close(); }

bool Timeline::open(const std::string& path) {
  std::lock_guard lock(mutex_);
  close_locked();
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) return false;
  std::fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", file_);
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
  if (file_ == nullptr) return;
  std::fputs("\n]}\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

int Timeline::row_of(const std::string& op_name) {
  auto [it, added] = rows_.emplace(op_name, static_cast<int>(rows_.size()) + 1);
  if (added) {  // name the row after the op
    nlohmann::json meta = {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", it->second}, {"args", {{"name", op_name}}}};
    std::fprintf(file_, "%s%s", first_ ? "" : ",\n", meta.dump().c_str());
    first_ = false;
  }
  return it->second;
}

void Timeline::record(const std::string& op_name, const char* phase, Clock::time_point start, Clock::time_point end) {
  if (!enabled()) return;
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
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
  std::fprintf(file_, ",\n%s", event.dump().c_str());
}

}  // namespace ddl::runtime
