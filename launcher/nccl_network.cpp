#include "launcher/nccl_network.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "backends/command.hpp"
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
// there) and reads what it exports. Run in a child process (probe_plugin): the plugin's
// constructors and libraries never run inside ddl.
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
    c.error = "it exports no ncclNetPlugin_vN, so NCCL uses its own sockets or InfiniBand";
  } else {
    // Every ncclNet_vN_t begins with the network's name (what NCCL_NET selects).
    const auto* api = static_cast<const char* const*>(::dlsym(library, fmt::format("ncclNetPlugin_v{}", c.net_versions[0]).c_str()));
    if (api != nullptr && *api != nullptr) c.network.assign(*api, ::strnlen(*api, 128));
  }
  return c;
}

std::string joined(const std::vector<int>& numbers) {
  std::string out;
  for (int n : numbers) out += std::to_string(n) + " ";
  return out;
}

std::vector<int> numbers_of(const std::string& line) {
  std::vector<int> out;
  std::istringstream words(line);
  for (int n; words >> n;) out.push_back(n);
  return out;
}

void write_all(int fd, const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// What the child wrote, until it closes the pipe (`closed`) or `deadline`.
std::string read_until(int fd, std::chrono::steady_clock::time_point deadline, bool& closed) {
  std::string text;
  closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return text;
    char buffer[4096];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) {
      closed = n == 0;
      return text;
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

NetPluginCandidate parse_probe(const std::string& name, const std::string& text) {
  NetPluginCandidate c;
  c.name = name;
  std::istringstream lines(text);
  std::string loads, nets, collnets;
  std::getline(lines, loads);
  std::getline(lines, c.path);
  std::getline(lines, c.network);
  std::getline(lines, nets);
  std::getline(lines, collnets);
  std::getline(lines, c.error);
  c.loads = loads == "1";
  c.net_versions = numbers_of(nets);
  c.collnet_versions = numbers_of(collnets);
  if (loads.empty()) c.error = "loading it ended without an answer";
  return c;
}

// try_plugin in a forked child, its answer back over a pipe, one field a line; a child that
// crashes or hangs (10 s) is the answer too.
NetPluginCandidate probe_plugin(const std::string& name) {
  NetPluginCandidate failed;
  failed.name = name;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    failed.error = "cannot probe it (pipe failed)";
    return failed;
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    const NetPluginCandidate found = try_plugin(name);
    std::string error = found.error;
    std::replace(error.begin(), error.end(), '\n', ' ');
    write_all(fds[1], fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n", found.loads ? 1 : 0, found.path, found.network, joined(found.net_versions),
                                  joined(found.collnet_versions), error));
    ::_exit(0);
  }
  ::close(fds[1]);
  if (child < 0) {
    ::close(fds[0]);
    failed.error = "cannot probe it (fork failed)";
    return failed;
  }
  bool closed = false;
  const std::string text = read_until(fds[0], std::chrono::steady_clock::now() + std::chrono::seconds(10), closed);
  ::close(fds[0]);
  if (!closed) ::kill(child, SIGKILL);  // still at it after 10 s (a child that closed the pipe is ending)
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!closed) {
    failed.error = "loading it did not finish within 10 s";
    return failed;
  }
  if (WIFSIGNALED(status)) {
    failed.error = fmt::format("loading it crashed ({})", ::strsignal(WTERMSIG(status)));
    return failed;
  }
  return parse_probe(name, text);
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

// NCCL takes the first library that opens; one without a net API leaves NCCL on its own transports.
const NetPluginCandidate* NcclNetwork::plugin() const {
  if (plugins_off) return nullptr;
  for (const auto& c : tried)
    if (c.loads) return c.net_versions.empty() ? nullptr : &c;
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

std::vector<const backends::SiteProfile*> sites_expecting_a_network(const std::vector<backends::ListedSite>& listed,
                                                                    const std::vector<std::string>& matching) {
  std::vector<const backends::SiteProfile*> expecting;
  for (const auto& site : listed)
    if (site.profile && !site.profile->nccl_network.empty() && std::find(matching.begin(), matching.end(), site.name) != matching.end())
      expecting.push_back(&*site.profile);
  return expecting;
}

std::optional<std::string> site_network_warning(const Environment& env) try {
  const auto listed = backends::list_sites();
  const auto expecting = sites_expecting_a_network(listed, backends::matching_sites(listed, full_host_name(), env));
  if (expecting.empty()) return std::nullopt;  // the plugin is probed only where a profile expects something
  const NcclNetwork network = inspect_nccl_network(env);
  for (const backends::SiteProfile* site : expecting)
    if (auto miss = network.misses(site->nccl_network))
      return fmt::format("WARNING: site {} expects NCCL to reach its nodes through {}, but {}; fix: {}", site->name, site->nccl_network,
                         *miss, site->nccl_network_fix);
  return std::nullopt;
} catch (const std::exception&) {
  return std::nullopt;  // a warning that cannot be worked out stops no run
}

NcclNetwork inspect_nccl_network(const Environment& env) {
  NcclNetwork n;
  n.plugin_setting = lookup(env, "NCCL_NET_PLUGIN").value_or("");
  n.plugins_off = lower(n.plugin_setting) == "none";
  if (!n.plugins_off)
    for (const auto& name : plugin_names(n.plugin_setting)) {
      n.tried.push_back(probe_plugin(name));
      if (n.tried.back().loads) break;  // as NCCL: the first that opens is the one
    }
  n.on_loader_path = plugins_on_loader_path(env);
  read_libfabric(n);
  for (const auto& [name, value] : env)
    if (name.starts_with("NCCL_") || name.starts_with("FI_")) n.settings.emplace_back(name, value);
  return n;
}

}  // namespace ddl::launcher
