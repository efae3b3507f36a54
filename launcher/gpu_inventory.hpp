// Which GPUs this node offers the run, and which one each local rank gets.
#pragma once

#include <string>
#include <vector>

#include "common/environment.hpp"

namespace ddl::launcher {

struct GpuInventory {
  std::vector<std::string> ids;  // CUDA_VISIBLE_DEVICES entries: indices, GPU-/MIG- UUIDs
  std::string source;            // where they came from, for messages
  int count() const { return static_cast<int>(ids.size()); }
};

// How GPUs are handed to local ranks: in order, or reversed (Polaris: GPU 3 is nearest the first cores).
enum class GpuOrder { AsListed, Reversed };

// `gpus` in the order local ranks take them.
GpuInventory in_order(GpuInventory gpus, GpuOrder order);

// The entries of a CUDA_VISIBLE_DEVICES value, as CUDA reads it: comma separated, blanks
// trimmed, and the list ends at the first entry that is a negative number.
GpuInventory parse_visible_devices(const std::string& value);

// The GPUs available: the inherited CUDA_VISIBLE_DEVICES when set, else the devices the CUDA
// driver (loaded only if present) or nvidia-smi reports, else none.
GpuInventory discover_gpus(const Environment& env);

// The GPU of a local rank: the local-rank-th entry, wrapping around when GPUs are shared.
const std::string& gpu_for_local_rank(const GpuInventory& gpus, int local_rank);

}  // namespace ddl::launcher
