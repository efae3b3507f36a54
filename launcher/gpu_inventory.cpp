#include "launcher/gpu_inventory.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "backends/command.hpp"
#include "common/error.hpp"

namespace ddl::launcher {

namespace {

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

GpuInventory numbered(int count, std::string source) {
  GpuInventory inv{{}, std::move(source)};
  for (int i = 0; i < count; ++i) inv.ids.push_back(std::to_string(i));
  return inv;
}

// Asks the CUDA driver API, if libcuda is installed; -1 when it cannot answer.
int cuda_driver_device_count() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return -1;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count_fn = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int count = -1;
  if (init != nullptr && count_fn != nullptr && init(0) == 0 && count_fn(&count) != 0) count = -1;
  // libcuda is not unloaded: unloading it after cuInit is not supported.
  return count;
}

// Counts GPUs with nvidia-smi when it is on PATH; -1 when it is not, fails, or does not answer
// within 10 s (a wedged driver can leave nvidia-smi hanging, and ddl run must not hang with it).
int nvidia_smi_device_count() {
  if (!backends::on_path("nvidia-smi")) return -1;
  const backends::CommandResult r =
      backends::run_command({"nvidia-smi", "--query-gpu=index", "--format=csv,noheader"}, std::chrono::seconds(10));
  if (!r.ok()) return -1;
  int lines = 0;
  size_t start = 0;
  while (start < r.out.size()) {
    size_t end = r.out.find('\n', start);
    if (end == std::string::npos) end = r.out.size();
    if (!trim(r.out.substr(start, end - start)).empty()) ++lines;
    start = end + 1;
  }
  return lines;
}

}  // namespace

GpuInventory parse_visible_devices(const std::string& value) {
  GpuInventory inv{{}, "CUDA_VISIBLE_DEVICES"};
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    std::string entry = trim(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    // As CUDA reads it: the list ends at the first entry that names no device (empty, negative, not
    // an index or a GPU-/MIG- UUID) and at one named twice.
    const bool index = !entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos;
    const bool uuid = entry.starts_with("GPU-") || entry.starts_with("MIG-");
    if ((!index && !uuid) || std::find(inv.ids.begin(), inv.ids.end(), entry) != inv.ids.end()) break;
    inv.ids.push_back(entry);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return inv;
}

GpuInventory discover_gpus(const Environment& env) {
  if (auto visible = lookup(env, "CUDA_VISIBLE_DEVICES")) return parse_visible_devices(*visible);
  if (int n = cuda_driver_device_count(); n >= 0) return numbered(n, "the CUDA driver");
  if (int n = nvidia_smi_device_count(); n >= 0) return numbered(n, "nvidia-smi");
  return {{}, "no CUDA driver or nvidia-smi"};
}

GpuInventory in_order(GpuInventory gpus, GpuOrder order) {
  if (order == GpuOrder::Reversed) std::reverse(gpus.ids.begin(), gpus.ids.end());
  return gpus;
}

const std::string& gpu_for_local_rank(const GpuInventory& gpus, int local_rank) {
  if (gpus.ids.empty()) throw Error("no GPU to assign", "this is a bug in ddl: GPU workers were planned without GPUs");
  return gpus.ids[static_cast<size_t>(local_rank) % gpus.ids.size()];
}

}  // namespace ddl::launcher
