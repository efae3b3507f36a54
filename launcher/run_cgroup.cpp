#include "launcher/run_cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace ddl::launcher {

namespace {

// Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1).
std::optional<std::string> cgroup2_mount() {
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mounts, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, device, root, mountpoint;
    if (fields >> id >> parent >> device >> root >> mountpoint && root == "/") return mountpoint;
  }
  return std::nullopt;
}

// This process's cgroup in the v2 hierarchy ("0::PATH" in /proc/self/cgroup).
std::optional<std::string> own_cgroup() {
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line))
    if (line.starts_with("0::")) return line.substr(3);
  return std::nullopt;
}

// Whether a process can enter the cgroup through `procs_fd`: a child tries, so that ddl stays where it is.
bool can_enter(int procs_fd) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(::write(procs_fd, "0", 1) == 1 ? 0 : 1);
  if (child < 0) return false;
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

RunCgroup RunCgroup::make() {
  static std::atomic<int> made{0};
  RunCgroup cgroup;
  const auto mount = cgroup2_mount();
  const auto own = own_cgroup();
  if (!mount || !own || own->find("/..") != std::string::npos || own->find(" (deleted)") != std::string::npos) return cgroup;
  const std::string parent = *own == "/" ? "" : *own;
  const std::string name = fmt::format("{}/ddl.{}.{}", parent, ::getpid(), made++);
  const std::string folder = *mount + name;
  if (::mkdir(folder.c_str(), 0755) != 0) return cgroup;
  const int procs = ::open((folder + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (procs < 0 || !can_enter(procs)) {
    if (procs >= 0) ::close(procs);
    ::rmdir(folder.c_str());
    return cgroup;
  }
  cgroup.name_ = name;
  cgroup.folder_ = folder;
  cgroup.procs_fd_ = procs;
  return cgroup;
}

RunCgroup::RunCgroup(RunCgroup&& other) noexcept
    : name_(std::move(other.name_)), folder_(std::move(other.folder_)), procs_fd_(std::exchange(other.procs_fd_, -1)) {}

RunCgroup& RunCgroup::operator=(RunCgroup&& other) noexcept {
  if (this != &other) {
    remove();
    name_ = std::move(other.name_);
    folder_ = std::move(other.folder_);
    procs_fd_ = std::exchange(other.procs_fd_, -1);
  }
  return *this;
}

RunCgroup::~RunCgroup() { remove(); }

void RunCgroup::remove() {
  if (procs_fd_ < 0) return;
  ::close(procs_fd_);
  procs_fd_ = -1;
  // A process leaves its cgroup when it is reaped: the last zombies may hold it for a moment.
  for (int attempt = 0; attempt < 100 && ::rmdir(folder_.c_str()) != 0 && errno == EBUSY; ++attempt)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  name_.clear();
  folder_.clear();
}

}  // namespace ddl::launcher
