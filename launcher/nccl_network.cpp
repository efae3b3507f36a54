#include "launcher/nccl_network.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "backends/command.hpp"
#include "backends/site_profile.hpp"
#include "launcher/host.hpp"

namespace ddl::launcher {

namespace {

// NCCL's plugin APIs so far (ncclNetPlugin_v2 .. _v11); newer ones are looked for too.
constexpr int kNewestNetApi = 16;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::vector<int> exported_versions(void* library, const char* prefix) {
  std::vector<int> versions;
  for (int v = kNewestNetApi; v >= 2; --v)
    if (::dlsym(library, fmt::format("{}{}", prefix, v).c_str()) != nullptr) versions.push_back(v);
  return versions;
}

// Loads `name` as NCCL does (RTLD_NOW | RTLD_LOCAL: a missing symbol fails here, as it would
// there), reads what it exports, and unloads it.
NetPluginCandidate try_plugin(const std::string& name) {
  NetPluginCandidate c;
  c.name = name;
  ::dlerror();
  void* library = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    c.error = why != nullptr ? why : "dlopen failed";
    return c;
  }
  c.loads = true;
  link_map* map = nullptr;
  if (::dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) c.path = map->l_name;
  c.net_versions = exported_versions(library, "ncclNetPlugin_v");
  c.collnet_versions = exported_versions(library, "ncclCollNetPlugin_v");
  if (c.net_versions.empty()) {
    c.error = "it exports no ncclNetPlugin_vN: not an NCCL net plugin NCCL can use";
  } else {
    // Every ncclNet_vN_t begins with the network's name (what NCCL_NET selects).
    const auto* api = static_cast<const char* const*>(::dlsym(library, fmt::format("ncclNetPlugin_v{}", c.net_versions[0]).c_str()));
    if (api != nullptr && *api != nullptr) c.network = std::string(*api).substr(0, 128);
  }
  ::dlclose(library);
  return c;
}

// NCCL's order: NCCL_NET_PLUGIN as given, then libnccl-net-<it>.so; unset, libnccl-net.so.
std::vector<std::string> plugin_names(const std::string& setting) {
  if (setting.empty()) return {"libnccl-net.so"};
  return {setting, fmt::format("libnccl-net-{}.so", setting)};
}

// libnccl-net.so, libnccl-net-ofi.so, libnccl-net.so.1.2: what NCCL or a module may install.
const std::regex kPluginFile(R"(libnccl-net[^/]*\.so(\.[0-9]+)*)");

std::vector<std::string> plugins_on_loader_path(const Environment& env) {
  std::vector<std::string> found;
  std::stringstream folders(lookup(env, "LD_LIBRARY_PATH").value_or(""));
  for (std::string folder; std::getline(folders, folder, ':');) {
    std::error_code ec;
    if (folder.empty() || !std::filesystem::is_directory(folder, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
      if (std::regex_match(entry.path().filename().string(), kPluginFile)) found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// `fi_info -l` lists libfabric's providers, one "name:" line each (then its version, indented).
void read_libfabric(NcclNetwork& n) {
  if (!backends::on_path("fi_info")) return;
  const backends::CommandResult r = backends::run_command({"fi_info", "-l"}, std::chrono::seconds(10));
  std::vector<std::string> providers;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && !std::isspace(static_cast<unsigned char>(line[0])) && line.back() == ':')
      providers.push_back(line.substr(0, line.size() - 1));
  if (!r.ok() && providers.empty()) n.fi_info_error = fmt::format("fi_info -l failed: {}", r.err.empty() ? r.out : r.err);
  n.libfabric_providers = std::move(providers);
}

}  // namespace

const NetPluginCandidate* NcclNetwork::plugin() const {
  if (plugins_off) return nullptr;
  for (const auto& c : tried)
    if (c.loads && !c.net_versions.empty()) return &c;
  return nullptr;
}

std::optional<std::string> NcclNetwork::misses(const std::string& expected) const {
  if (expected != "ofi") return std::nullopt;
  if (plugins_off) return "NCCL_NET_PLUGIN=none turns NCCL's net plugins off, so NCCL uses its own TCP sockets between nodes";
  const NetPluginCandidate* p = plugin();
  if (p == nullptr) {
    // The last one tried says most (NCCL_NET_PLUGIN=x: libnccl-net-x.so); dlerror names the file.
    const NetPluginCandidate& last = tried.back();
    const std::string why = last.error.starts_with(last.name) ? last.error : last.name + ": " + last.error;
    return fmt::format(
        "no NCCL net plugin loads ({}), so NCCL falls back to its own TCP sockets between nodes, silently and several "
        "times slower",
        why);
  }
  const std::string network = lower(p->network);
  if (network.find("libfabric") == std::string::npos && network.find("ofi") == std::string::npos)
    return fmt::format("the net plugin NCCL loads ({}) serves '{}', not libfabric (OFI)", p->path, p->network);
  for (const auto& [name, value] : settings)
    if (name == "NCCL_NET" && lower(value) != network)
      return fmt::format("NCCL_NET={} makes NCCL use that network instead of its plugin's '{}'", value, p->network);
  return std::nullopt;
}

std::optional<std::string> site_network_warning(const Environment& env) {
  const auto listed = backends::list_sites();
  const auto sites = backends::matching_sites(listed, full_host_name(), env);
  std::optional<NcclNetwork> network;  // inspected once, only where a profile expects something
  for (const auto& site : listed) {
    if (!site.profile || site.profile->nccl_network.empty() || std::find(sites.begin(), sites.end(), site.name) == sites.end()) continue;
    if (!network) network = inspect_nccl_network(env);
    if (auto miss = network->misses(site.profile->nccl_network))
      return fmt::format("WARNING: site {} expects NCCL to reach its nodes through {}, but {}; fix: {}", site.name,
                         site.profile->nccl_network, *miss, site.profile->nccl_network_fix);
  }
  return std::nullopt;
}

NcclNetwork inspect_nccl_network(const Environment& env) {
  NcclNetwork n;
  n.plugin_setting = lookup(env, "NCCL_NET_PLUGIN").value_or("");
  n.plugins_off = lower(n.plugin_setting) == "none";
  if (!n.plugins_off)
    for (const auto& name : plugin_names(n.plugin_setting)) n.tried.push_back(try_plugin(name));
  n.on_loader_path = plugins_on_loader_path(env);
  read_libfabric(n);
  for (const auto& [name, value] : env)
    if (name.starts_with("NCCL_") || name.starts_with("FI_")) n.settings.emplace_back(name, value);
  return n;
}

}  // namespace ddl::launcher
