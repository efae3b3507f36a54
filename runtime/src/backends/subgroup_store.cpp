// The rendezvous store of a process set: the world's store under a prefix of the set's own, with
// the trailing rank of each key (Gloo and the shared-memory setup name keys after their owner's
// rank in the set) turned into the owner's world rank, which is what the PMIx store looks up.
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/src/backends/collectives.hpp"

namespace ddl::runtime {
namespace {

class SubgroupStore final : public gloo::rendezvous::Store {
 public:
  SubgroupStore(gloo::rendezvous::Store& world, std::string prefix, std::vector<int> world_ranks, bool forward_wait)
      : world_(world), prefix_(std::move(prefix)), world_ranks_(std::move(world_ranks)), forward_wait_(forward_wait) {}

  void set(const std::string& key, const std::vector<char>& data) override { world_.set(mapped(key), data); }
  std::vector<char> get(const std::string& key) override { return world_.get(mapped(key)); }
  void wait(const std::vector<std::string>& keys) override {
    if (forward_wait_) world_.wait(mapped(keys));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (forward_wait_) world_.wait(mapped(keys), timeout);
  }

 private:
  std::string mapped(const std::string& key) const {
    size_t start = key.size();
    while (start > 0 && key[start - 1] >= '0' && key[start - 1] <= '9') --start;
    if (start == key.size() || key.size() - start > 9) return prefix_ + key;
    const auto set_rank = static_cast<size_t>(std::stoi(key.substr(start)));
    if (set_rank >= world_ranks_.size()) return prefix_ + key;
    return prefix_ + key.substr(0, start) + std::to_string(world_ranks_[set_rank]);
  }
  std::vector<std::string> mapped(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(mapped(k));
    return out;
  }

  gloo::rendezvous::Store& world_;
  std::string prefix_;
  std::vector<int> world_ranks_;
  bool forward_wait_;
};

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> make_subgroup_store(gloo::rendezvous::Store& world, std::string prefix,
                                                             std::vector<int> world_ranks, bool forward_wait) {
  return std::make_unique<SubgroupStore>(world, std::move(prefix), std::move(world_ranks), forward_wait);
}

}  // namespace ddl::runtime
