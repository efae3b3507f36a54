// A rank's sign of life for the hang watchdog of the supervisor that started it: a file whose
// modification time the engine moves forward as ops complete, once a second at most, so that the
// cost per op is one clock read.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

namespace ddl::runtime {

class ProgressMark {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kInterval{1};

  ProgressMark() = default;
  // Creates `path` (an empty path, or one that cannot be written, marks nothing: the watchdog then
  // goes by the rank's output alone).
  explicit ProgressMark(const std::string& path);
  ~ProgressMark();
  ProgressMark(const ProgressMark&) = delete;
  ProgressMark& operator=(const ProgressMark&) = delete;

  // Ops completed: the file's time moves to now, unless it moved less than kInterval ago. Any thread.
  void note() {
    if (fd_ < 0) return;
    const auto now = Clock::now().time_since_epoch().count();
    auto last = last_.load(std::memory_order_relaxed);
    if (now - last < std::chrono::duration_cast<Clock::duration>(kInterval).count()) return;
    if (last_.compare_exchange_strong(last, now, std::memory_order_relaxed)) touch();
  }

 private:
  void touch() const;
  int fd_ = -1;
  std::atomic<Clock::rep> last_{0};
};

}  // namespace ddl::runtime
