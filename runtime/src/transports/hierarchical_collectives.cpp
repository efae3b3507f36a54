// A world over several hosts with the same number of ranks on each, numbered host by host: shared
// memory among the ranks of a host, Gloo over TCP between hosts. Bulk data crosses the network
// once per host (an allreduce: each local rank carries one slice of the host's sum to its peers of
// the same local rank on the other hosts, all slices at once); the negotiation round and alltoall
// go over the world's own Gloo mesh.
#include <algorithm>
#include <cstddef>
#include <vector>

#include <gloo/rendezvous/store.h>

#include <fmt/format.h>

#include "rendezvous/gloo_store.hpp"
#include "runtime/src/transports/collectives.hpp"

namespace ddl::runtime {
namespace {

class HierarchicalCollectives final : public Collectives {
 public:
  HierarchicalCollectives(std::unique_ptr<Collectives> world, std::unique_ptr<Collectives> local, std::unique_ptr<Collectives> cross)
      : world_(std::move(world)), local_(std::move(local)), cross_(std::move(cross)) {}

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }

  std::vector<std::string> allgather_bytes(const std::string& mine) override { return world_->allgather_bytes(mine); }

  // The host's sum in shared memory; slice l of it summed across hosts by local rank l; the
  // slices shared again in shared memory.
  void allreduce(void* data, size_t count, size_t element_size, ReduceFunction reduce) override {
    if (count == 0) return;
    local_->allreduce(data, count, element_size, reduce);
    const auto L = static_cast<size_t>(local_->size());
    std::vector<size_t> bytes(L);
    for (size_t l = 0; l < L; ++l) bytes[l] = (count * (l + 1) / L - count * l / L) * element_size;
    const size_t mine = static_cast<size_t>(local_->rank());
    char* slice = static_cast<char*>(data) + count * mine / L * element_size;
    if (bytes[mine] > 0) cross_->allreduce(slice, bytes[mine] / element_size, element_size, reduce);
    local_->allgatherv(slice, data, bytes);
  }

  // Across hosts among the ranks with the root's local rank, then within each host from it.
  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    const int root_local = root % local_->size();
    if (local_->rank() == root_local) cross_->broadcast(data, bytes, root / local_->size());
    local_->broadcast(data, bytes, root_local);
  }

  // Each host gathers its ranks' parts; the hosts' first ranks exchange hosts' blocks; each
  // host's first rank shares the whole.
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& bytes_per_rank) override {
    const int L = local_->size();
    const int hosts = size() / L;
    std::vector<size_t> block(static_cast<size_t>(hosts), 0), offset(static_cast<size_t>(hosts) + 1, 0);
    for (int r = 0; r < size(); ++r) block[static_cast<size_t>(r / L)] += bytes_per_rank[static_cast<size_t>(r)];
    for (int h = 0; h < hosts; ++h) offset[static_cast<size_t>(h) + 1] = offset[static_cast<size_t>(h)] + block[static_cast<size_t>(h)];
    if (offset.back() == 0) return;
    const int host = rank() / L;
    char* out = static_cast<char*>(recv);
    const auto first = static_cast<std::ptrdiff_t>(host) * L;
    const std::vector<size_t> local_parts(bytes_per_rank.begin() + first, bytes_per_rank.begin() + first + L);
    local_->allgatherv(send, out + offset[static_cast<size_t>(host)], local_parts);
    if (local_->rank() == 0) {
      const std::vector<char> own(out + offset[static_cast<size_t>(host)], out + offset[static_cast<size_t>(host) + 1]);
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
  std::unique_ptr<Collectives> world_;  // every rank, over Gloo
  std::unique_ptr<Collectives> local_;  // this host's ranks, in shared memory
  std::unique_ptr<Collectives> cross_;  // the ranks of this local rank on every host, over Gloo
};

}  // namespace

std::unique_ptr<Collectives> make_hierarchical_collectives(int rank, int size, int local_size, gloo::rendezvous::Store& store,
                                                           const std::string& interface_host, std::chrono::milliseconds timeout) {
  auto world = make_gloo_collectives(rank, size, store, interface_host, timeout);
  if (local_size < 2 || size % local_size != 0 || size == local_size) return world;
  const int host = rank / local_size, local_rank = rank % local_size, hosts = size / local_size;
  std::vector<int> host_ranks, peer_ranks;
  for (int l = 0; l < local_size; ++l) host_ranks.push_back(host * local_size + l);
  for (int h = 0; h < hosts; ++h) peer_ranks.push_back(h * local_size + local_rank);
  auto host_store = make_subgroup_store(store, fmt::format("host{}", host), host_ranks, /*forward_wait=*/true);
  auto local = make_shared_memory_collectives(local_rank, local_size, *host_store, timeout);
  // Every host must have its shared memory, or no host uses it: ask the whole world.
  const auto said = world->allgather_bytes(local ? "1" : "0");
  if (std::any_of(said.begin(), said.end(), [](const std::string& s) { return s != "1"; })) return world;
  auto peer_store = make_subgroup_store(store, fmt::format("peers{}/", local_rank), peer_ranks, /*forward_wait=*/true);
  auto cross = make_gloo_collectives(host, hosts, *peer_store, interface_host, timeout);
  return std::make_unique<HierarchicalCollectives>(std::move(world), std::move(local), std::move(cross));
}

}  // namespace ddl::runtime
