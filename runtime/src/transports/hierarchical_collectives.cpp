// A world over several hosts, numbered host by host (any number of ranks on each): shared
// memory among the ranks of a host, Gloo over TCP between hosts. Bulk data crosses the network
// once per host (an allreduce: each local rank carries one slice of the host's sum to its peers of
// the same local rank on the other hosts, all slices at once); the negotiation round and alltoall
// go over the world's own Gloo mesh.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <vector>

#include <gloo/rendezvous/store.h>

#include <fmt/format.h>

#include "rendezvous/gloo_store.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {
namespace {

// Which host each rank is on, hosts numbered in rank order, each holding a contiguous run of ranks.
struct HostLayout {
  std::vector<int> host_of;   // by rank
  std::vector<int> first_of;  // by host: its first rank; first_of[hosts] == size
  int hosts() const { return static_cast<int>(first_of.size()) - 1; }
  int size_of(int host) const { return first_of[static_cast<size_t>(host) + 1] - first_of[static_cast<size_t>(host)]; }
  int fewest() const {
    int fewest = size_of(0);
    for (int h = 1; h < hosts(); ++h) fewest = std::min(fewest, size_of(h));
    return fewest;
  }
};

class HierarchicalCollectives final : public Collectives {
 public:
  HierarchicalCollectives(HostLayout layout, std::unique_ptr<Collectives> world, std::unique_ptr<Collectives> local,
                          std::unique_ptr<Collectives> cross)
      : layout_(std::move(layout)),
        lanes_(layout_.fewest()),
        world_(std::move(world)),
        local_(std::move(local)),
        cross_(std::move(cross)) {}

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }

  std::vector<std::string> allgather_bytes(const std::string& mine) override { return world_->allgather_bytes(mine); }

  // The host's sum in shared memory; slice l of it summed across hosts by local rank l (one slice
  // per local rank that every host has); the slices shared again in shared memory.
  void allreduce(void* data, size_t bytes, size_t element_size, ReduceFunction reduce) override {
    if (bytes == 0) return;
    local_->allreduce(data, bytes, element_size, reduce);
    // The slices split the elements, never one element.
    const size_t count = bytes / element_size;
    const auto lanes = static_cast<size_t>(lanes_);
    std::vector<size_t> slice_bytes(static_cast<size_t>(local_->size()), 0);
    for (size_t l = 0; l < lanes; ++l) slice_bytes[l] = (count * (l + 1) / lanes - count * l / lanes) * element_size;
    const auto mine = static_cast<size_t>(local_->rank());
    char* slice = static_cast<char*>(data) + (mine < lanes ? count * mine / lanes * element_size : 0);
    if (slice_bytes[mine] > 0) cross_->allreduce(slice, slice_bytes[mine], element_size, reduce);
    local_->allgatherv(slice, data, slice_bytes);
  }

  // Across hosts among the ranks with the root's local rank, then within each host from it; a
  // root whose local rank not every host has goes through its host's first rank.
  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    const int root_host = layout_.host_of[static_cast<size_t>(root)];
    const int root_local = root - layout_.first_of[static_cast<size_t>(root_host)];
    const bool on_root_host = layout_.host_of[static_cast<size_t>(rank())] == root_host;
    if (root_local < lanes_) {
      if (local_->rank() == root_local) cross_->broadcast(data, bytes, root_host);
      local_->broadcast(data, bytes, root_local);
      return;
    }
    if (on_root_host) local_->broadcast(data, bytes, root_local);
    if (local_->rank() == 0) cross_->broadcast(data, bytes, root_host);
    if (!on_root_host) local_->broadcast(data, bytes, 0);
  }

  // Each host gathers its ranks' parts; the hosts' first ranks exchange hosts' blocks; each
  // host's first rank shares the whole.
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) override {
    const int hosts = layout_.hosts();
    std::vector<size_t> block(static_cast<size_t>(hosts), 0), offset(static_cast<size_t>(hosts) + 1, 0);
    for (int r = 0; r < size(); ++r)
      block[static_cast<size_t>(layout_.host_of[static_cast<size_t>(r)])] += bytes_per_rank[static_cast<size_t>(r)];
    for (int h = 0; h < hosts; ++h) offset[static_cast<size_t>(h) + 1] = offset[static_cast<size_t>(h)] + block[static_cast<size_t>(h)];
    if (offset.back() == 0) return;
    const auto host = static_cast<size_t>(layout_.host_of[static_cast<size_t>(rank())]);
    char* out = static_cast<char*>(recv);
    const auto first = static_cast<std::ptrdiff_t>(layout_.first_of[host]);
    const std::vector<size_t> local_parts(bytes_per_rank.begin() + first, bytes_per_rank.begin() + first + local_->size());
    local_->allgatherv(send, out + offset[host], local_parts);
    if (local_->rank() == 0) {
      const std::vector<char> own(out + offset[host], out + offset[host + 1]);
      cross_->allgatherv(own.data(), out, block);
    }
    local_->broadcast(out, offset.back(), 0);
  }

  void alltoall(const void* send, void* recv, size_t bytes_per_rank) override { world_->alltoall(send, recv, bytes_per_rank); }

  void barrier() override {
    local_->barrier();
    if (local_->rank() == 0) cross_->barrier();
    local_->barrier();
  }

 private:
  HostLayout layout_;
  int lanes_;                           // local ranks every host has: each carries one slice across hosts
  std::unique_ptr<Collectives> world_;  // every rank, over Gloo
  std::unique_ptr<Collectives> local_;  // this host's ranks, in shared memory (or the one rank itself)
  std::unique_ptr<Collectives> cross_;  // the ranks of this local rank on every host, over Gloo; none past lanes_
};

// The hosts of the world from every rank's node rank, or nullopt when a host's ranks are not
// contiguous (a launch that numbered ranks otherwise: plain Gloo serves it).
std::optional<HostLayout> host_layout(const std::vector<std::string>& node_of_rank) {
  HostLayout layout;
  for (size_t r = 0; r < node_of_rank.size(); ++r) {
    const int node = std::atoi(node_of_rank[r].c_str());
    const int expected_new = static_cast<int>(layout.first_of.size());
    if (r > 0 && node == layout.host_of.back()) {
      layout.host_of.push_back(node);
      continue;
    }
    if (node != expected_new) return std::nullopt;
    layout.host_of.push_back(node);
    layout.first_of.push_back(static_cast<int>(r));
  }
  layout.first_of.push_back(static_cast<int>(node_of_rank.size()));
  return layout;
}

}  // namespace

std::unique_ptr<Collectives> make_hierarchical_collectives(int rank, int size, int node_rank, gloo::rendezvous::Store& store,
                                                           const std::string& interface_host, std::chrono::milliseconds timeout) {
  auto world = make_gloo_collectives(rank, size, store, interface_host, timeout);
  const std::optional<HostLayout> layout = host_layout(world->allgather_bytes(std::to_string(node_rank)));
  if (!layout || layout->hosts() < 2 || layout->hosts() == size) return world;
  const int host = layout->host_of[static_cast<size_t>(rank)], hosts = layout->hosts();
  const int first = layout->first_of[static_cast<size_t>(host)], local_size = layout->size_of(host), local_rank = rank - first;
  std::vector<int> host_ranks;
  for (int l = 0; l < local_size; ++l) host_ranks.push_back(first + l);
  std::unique_ptr<Collectives> local;
  if (local_size == 1) {
    local = make_single_process_collectives();
  } else {
    auto host_store = make_subgroup_store(store, fmt::format("host{}", host), host_ranks, /*forward_wait=*/true, timeout);
    local = make_shared_memory_collectives(local_rank, local_size, *host_store, timeout);
  }
  // Every host must have its shared memory, or no host uses it: ask the whole world.
  const auto said = world->allgather_bytes(local ? "1" : "0");
  if (std::any_of(said.begin(), said.end(), [](const std::string& s) { return s != "1"; })) return world;
  std::unique_ptr<Collectives> cross;
  if (local_rank < layout->fewest()) {
    std::vector<int> peer_ranks;
    for (int h = 0; h < hosts; ++h) peer_ranks.push_back(layout->first_of[static_cast<size_t>(h)] + local_rank);
    auto peer_store = make_subgroup_store(store, fmt::format("peers{}/", local_rank), peer_ranks, /*forward_wait=*/true, timeout);
    cross = make_gloo_collectives(host, hosts, *peer_store, interface_host, timeout);
  }
  return std::make_unique<HierarchicalCollectives>(*layout, std::move(world), std::move(local), std::move(cross));
}

}  // namespace ddl::runtime
