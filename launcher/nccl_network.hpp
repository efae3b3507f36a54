// Which network NCCL will use between nodes, found as NCCL finds it: its net plugin
// (NCCL_NET_PLUGIN, else libnccl-net.so, loaded with dlopen from the loader's path), the plugin's
// API versions and name, libfabric's providers (fi_info), and the NCCL_* / FI_* settings in effect.
// When no plugin loads NCCL uses its own sockets (or InfiniBand verbs) without an error: on
// Slingshot (Perlmutter, Polaris) that is TCP, several times slower than the OFI plugin.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/site_profile.hpp"
#include "common/environment.hpp"

namespace ddl::launcher {

// One library NCCL would try, in its order.
struct NetPluginCandidate {
  std::string name;  // as NCCL asks the loader for it ("libnccl-net.so")
  bool loads = false;
  std::string path;                   // the file it loaded from
  std::string network;                // the name the plugin gives its network ("AWS Libfabric"), if it says
  std::vector<int> net_versions;      // ncclNetPlugin_vN it exports, newest first
  std::vector<int> collnet_versions;  // ncclCollNetPlugin_vN
  std::string error;                  // why it does not load, or exports no ncclNetPlugin_vN
};

struct NcclNetwork {
  std::string plugin_setting;                                   // NCCL_NET_PLUGIN ("" when unset)
  bool plugins_off = false;                                     // NCCL_NET_PLUGIN=none
  std::vector<NetPluginCandidate> tried;                        // in NCCL's order; the first usable one is NCCL's
  std::vector<std::string> on_loader_path;                      // every libnccl-net*.so in LD_LIBRARY_PATH's folders
  std::optional<std::vector<std::string>> libfabric_providers;  // fi_info -l; nullopt: no fi_info
  std::string fi_info_error;
  std::vector<std::pair<std::string, std::string>> settings;  // NCCL_* and FI_* in effect, by name
  // The plugin NCCL would use, if one loads and exports a net API.
  const NetPluginCandidate* plugin() const;
  // Whether NCCL would reach the network `expected` ("ofi": libfabric through a plugin whose
  // network is Libfabric or OFI); nullopt when it would, else why not.
  std::optional<std::string> misses(const std::string& expected) const;
};

NcclNetwork inspect_nccl_network(const Environment& env);

// The profiles among `listed` that match this machine (`matching`, backends::matching_sites) and
// expect a network (nccl_network): check-build's verdict lines and ddl run's warning.
std::vector<const backends::SiteProfile*> sites_expecting_a_network(const std::vector<backends::ListedSite>& listed,
                                                                    const std::vector<std::string>& matching);

// `ddl run`'s word on it before a multi-node GPU run on a machine a site profile matches that
// expects a network (nccl_network): "WARNING: ...; fix: ..." when NCCL would miss it.
std::optional<std::string> site_network_warning(const Environment& env);

}  // namespace ddl::launcher
