// Gloo's rendezvous interface (gloo::rendezvous::Store) over ddl's rendezvous: the ddl store, a
// PMIx store (rendezvous/pmix_store.hpp), and a process set's view of either. Key prefixes are
// Gloo's own PrefixStore ("prefix/key"), so that the keys of one ddl_init, or of one process set,
// never meet another's.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/tcp_store_client.hpp"

namespace gloo::rendezvous {
class Store;
}

namespace ddl::runtime {

// `store` with every key under `prefix` (Gloo's PrefixStore), owning `store`.
std::unique_ptr<gloo::rendezvous::Store> with_prefix(std::unique_ptr<gloo::rendezvous::Store> store, const std::string& prefix);

// Gloo's rendezvous store over the ddl store (DDL_STORE_ADDR), under `prefix`.
std::unique_ptr<gloo::rendezvous::Store> make_tcp_gloo_store(store::TcpStoreClient client, const std::string& prefix);

// A store the program provides (libddl's ddl_init_with_store), as two functions: `set` stores a
// value (throwing if it cannot), `get` waits at most the given time for a key and gives its value,
// or nullopt if it did not come.
struct ProgramStore {
  std::function<void(const std::string& key, const std::vector<char>& value)> set;
  std::function<std::optional<std::vector<char>>(const std::string& key, std::chrono::milliseconds timeout)> get;
};

// Gloo's rendezvous store over the program's, under `prefix`: a get waits at most `timeout`, then
// throws naming the key.
std::unique_ptr<gloo::rendezvous::Store> make_program_gloo_store(ProgramStore store, const std::string& prefix,
                                                                 std::chrono::milliseconds timeout);

// The store a process set rendezvouses through: `world` under `prefix`, keys ending in a rank of
// the set renamed after that rank's world rank (world_ranks[set rank]), which is what the PMIx
// store looks a key's owner up by. forward_wait=false for a store whose wait() would be a
// world-wide fence (PMIx) and whose get() already blocks; else a get() waits at most `timeout`
// for its key. `world` must outlive it.
std::unique_ptr<gloo::rendezvous::Store> make_subgroup_store(gloo::rendezvous::Store& world, const std::string& prefix,
                                                             std::vector<int> world_ranks, bool forward_wait,
                                                             std::chrono::milliseconds timeout);

}  // namespace ddl::runtime
