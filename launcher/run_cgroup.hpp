// A cgroup v2 of the run's own, where the system lets ddl make one: its workers enter it before they
// exec, and everything they fork stays in it whatever it does to its session or environment, so
// the guard (orphan_guard) finds it all even when ddl is killed with kill -9.
#pragma once

#include <string>

namespace ddl::launcher {

class RunCgroup {
 public:
  // Makes `<ddl's cgroup>/ddl.<pid>.<n>` where cgroup v2 is mounted, ddl may make a child of its
  // own cgroup (root, a systemd user session's delegated subtree) and a process of ddl's may enter
  // it; otherwise one that is not in use (the guard then goes by sessions and the environment).
  static RunCgroup make();
  RunCgroup() = default;
  RunCgroup(RunCgroup&& other) noexcept;
  RunCgroup& operator=(RunCgroup&& other) noexcept;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;
  ~RunCgroup();  // removes it, once empty

  bool in_use() const { return procs_fd_ >= 0; }
  // As /proc/PID/cgroup names it ("/user.slice/.../ddl.123.0"); "" when not in use.
  const std::string& name() const { return name_; }
  // Its folder under the cgroup2 mount; "" when not in use.
  const std::string& folder() const { return folder_; }
  // Its cgroup.procs, open for writing (close-on-exec): a worker writes "0" there to enter; -1 when not in use.
  int procs_fd() const { return procs_fd_; }
  // Removes the folder once every process has left it (waits briefly for the last zombies). Idempotent.
  void remove();

 private:
  std::string name_;
  std::string folder_;
  int procs_fd_ = -1;
};

}  // namespace ddl::launcher
