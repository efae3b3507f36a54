#include "launcher/host_list.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/text_file.hpp"

namespace ddl::launcher {

namespace {

constexpr int kMostSlots = 1 << 20;

std::optional<int> slot_count(std::string_view text) {
  int n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > kMostSlots) return std::nullopt;
  return n;
}

// Hosts in the order first named; a host named again adds its slots to its first entry. Found by
// name in a map: a hostfile of a million lines is read in seconds, not hours.
class HostsInOrder {
 public:
  void add(const std::string& name, int slots) {
    auto [it, added] = index_.try_emplace(name, hosts_.size());
    if (added)
      hosts_.push_back({name, slots});
    else
      hosts_[it->second].slots = std::min(kMostSlots, hosts_[it->second].slots + slots);
  }
  bool empty() const { return hosts_.empty(); }
  std::vector<HostSlots> take() { return std::move(hosts_); }

 private:
  std::vector<HostSlots> hosts_;
  std::unordered_map<std::string, size_t> index_;
};

std::string trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return std::string(s.substr(first, s.find_last_not_of(" \t\r") - first + 1));
}

// "host" or "host:N"; nullopt-free: throws with `where` naming the flag or file line.
HostSlots host_and_slots(const std::string& entry, const std::string& where, const char* example) {
  if (std::count(entry.begin(), entry.end(), ':') > 1)  // "::1", "fe80::1:4": read as host ':' with 1 slot
    throw UsageError(fmt::format("{}: '{}' looks like an IPv6 address, which ddl does not take", where, entry),
                     fmt::format("use the host's name or IPv4 address, as {}", example));
  const auto colon = entry.rfind(':');
  HostSlots h{entry.substr(0, colon), 1};
  if (colon != std::string::npos) {
    auto n = slot_count(std::string_view(entry).substr(colon + 1));
    if (!n)
      throw UsageError(fmt::format("{}: '{}' has no whole slot count after ':' (1 to {})", where, entry, kMostSlots),
                       fmt::format("write it as {}", example));
    h.slots = *n;
  }
  if (!valid_host_name(h.name))
    throw UsageError(fmt::format("{}: '{}' is not a host name", where, h.name),
                     fmt::format("use names or addresses of letters, digits, '.', '-' and '_', as {}", example));
  return h;
}

}  // namespace

bool valid_host_name(std::string_view name) {
  if (name.empty() || name.size() > 253 || name.front() == '-') return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'; });
}

std::vector<HostSlots> parse_host_flag(const std::string& value) {
  HostsInOrder hosts;
  std::stringstream entries(value);
  for (std::string entry; std::getline(entries, entry, ',');) {
    entry = trimmed(entry);
    if (entry.empty()) throw UsageError(fmt::format("-H '{}' has an empty host entry", value), "write it as -H host1:4,host2:4");
    HostSlots h = host_and_slots(entry, "-H", "-H host1:4,host2:4");
    hosts.add(h.name, h.slots);
  }
  if (hosts.empty()) throw UsageError("-H names no host", "write it as -H host1:4,host2:4");
  return hosts.take();
}

std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& path) {
  HostsInOrder hosts;
  std::stringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    line = trimmed(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = fmt::format("--hostfile {} line {}", path, number);
    std::stringstream words(line);
    std::string first;
    words >> first;
    HostSlots h = host_and_slots(first, where, "'host1 slots=4' or 'host1:4'");
    std::optional<int> max_slots;  // ddl never places more than `slots` on a host; OpenMPI's cap may not be lower
    for (std::string word; words >> word;) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots"))
        throw UsageError(fmt::format("{}: '{}' is not slots=N", where, word), "write each line as 'host1 slots=4'");
      auto n = slot_count(std::string_view(word).substr(eq + 1));
      if (!n)
        throw UsageError(fmt::format("{}: '{}' needs a whole number from 1 to {}", where, word, kMostSlots),
                         "write each line as 'host1 slots=4'");
      if (key == "slots")
        h.slots = *n;
      else
        max_slots = *n;
    }
    if (max_slots && *max_slots < h.slots)
      throw UsageError(fmt::format("{}: max_slots={} is fewer than its {} slots", where, *max_slots, h.slots),
                       "give max_slots at least slots, or fewer slots");
    hosts.add(h.name, h.slots);
  }
  if (hosts.empty()) throw UsageError(fmt::format("--hostfile {} names no host", path), "write one host per line: 'host1 slots=4'");
  return hosts.take();
}

std::vector<HostSlots> read_hostfile(const std::string& path) { return parse_hostfile_text(read_text_file(path, "--hostfile"), path); }

}  // namespace ddl::launcher
