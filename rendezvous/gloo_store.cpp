#include "rendezvous/gloo_store.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

namespace ddl::runtime {

namespace {

// Gloo's store interface over the ddl store's client.
class TcpGlooStore final : public gloo::rendezvous::Store {
 public:
  explicit TcpGlooStore(store::TcpStoreClient client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_.set(key, std::string(data.begin(), data.end())); }
  std::vector<char> get(const std::string& key) override {
    std::string value = client_.get(key);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { client_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override { client_.wait(keys, timeout); }

 private:
  store::TcpStoreClient client_;
};

class ProgramGlooStore final : public gloo::rendezvous::Store {
 public:
  ProgramGlooStore(ProgramStore store, std::chrono::milliseconds timeout) : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return get_within(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) (void)get_within(key, timeout);
  }

 private:
  std::vector<char> get_within(const std::string& key, std::chrono::milliseconds timeout) {
    std::optional<std::vector<char>> value = store_.get(key, timeout);
    if (!value)
      throw std::runtime_error(
          fmt::format("the program's store did not give key '{}' within {} ms: a peer never came, or its "
                      "store is another (check rank, world size and the store's address)",
                      key, timeout.count()));
    return std::move(*value);
  }

  ProgramStore store_;
  std::chrono::milliseconds timeout_;
};

// PrefixStore holds a reference to the store it prefixes; this one also owns it. (The owned store
// is a base listed first, so it is built before, and destroyed after, the PrefixStore.)
struct OwnedStore {
  std::unique_ptr<gloo::rendezvous::Store> owned;
};
class OwningPrefixStore final : private OwnedStore, public gloo::rendezvous::PrefixStore {
 public:
  OwningPrefixStore(std::unique_ptr<gloo::rendezvous::Store> store, const std::string& prefix)
      : OwnedStore{std::move(store)}, PrefixStore(prefix, *owned) {}
};

// A process set's keys: Gloo and the shared-memory setup name keys after their owner's rank in
// the set; the world store (PMIx in particular) needs the owner's world rank there.
class SubgroupStore final : public gloo::rendezvous::Store {
 public:
  SubgroupStore(std::unique_ptr<gloo::rendezvous::Store> prefixed_world, std::vector<int> world_ranks, bool forward_wait,
                std::chrono::milliseconds timeout)
      : world_(std::move(prefixed_world)), world_ranks_(std::move(world_ranks)), forward_wait_(forward_wait), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override { world_->set(mapped(key), data); }
  // Within the set's timeout: a bare get waits for the world store's own, much longer one (a member
  // that never comes, or looks under another set's key, held the others well past the caller's timeout).
  std::vector<char> get(const std::string& key) override {
    const std::string world_key = mapped(key);
    if (forward_wait_) world_->wait({world_key}, timeout_);
    return world_->get(world_key);
  }
  void wait(const std::vector<std::string>& keys) override {
    if (forward_wait_) world_->wait(mapped(keys));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (forward_wait_) world_->wait(mapped(keys), timeout);
  }

 private:
  std::string mapped(const std::string& key) const {
    size_t start = key.size();
    while (start > 0 && key[start - 1] >= '0' && key[start - 1] <= '9') --start;
    if (start == key.size() || key.size() - start > 9) return key;
    const auto set_rank = static_cast<size_t>(std::stoi(key.substr(start)));
    if (set_rank >= world_ranks_.size()) return key;
    return key.substr(0, start) + std::to_string(world_ranks_[set_rank]);
  }
  std::vector<std::string> mapped(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(mapped(k));
    return out;
  }

  std::unique_ptr<gloo::rendezvous::Store> world_;
  std::vector<int> world_ranks_;
  bool forward_wait_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> with_prefix(std::unique_ptr<gloo::rendezvous::Store> store, const std::string& prefix) {
  return std::make_unique<OwningPrefixStore>(std::move(store), prefix);
}

std::unique_ptr<gloo::rendezvous::Store> make_tcp_gloo_store(store::TcpStoreClient client, const std::string& prefix) {
  return with_prefix(std::make_unique<TcpGlooStore>(std::move(client)), prefix);
}

std::unique_ptr<gloo::rendezvous::Store> make_program_gloo_store(ProgramStore store, const std::string& prefix,
                                                                 std::chrono::milliseconds timeout) {
  return with_prefix(std::make_unique<ProgramGlooStore>(std::move(store), timeout), prefix);
}

std::unique_ptr<gloo::rendezvous::Store> make_subgroup_store(gloo::rendezvous::Store& world, const std::string& prefix,
                                                             std::vector<int> world_ranks, bool forward_wait,
                                                             std::chrono::milliseconds timeout) {
  return std::make_unique<SubgroupStore>(std::make_unique<gloo::rendezvous::PrefixStore>(prefix, world), std::move(world_ranks),
                                         forward_wait, timeout);
}

}  // namespace ddl::runtime
