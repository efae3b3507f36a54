#include "launcher/host_exclusion.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"

namespace ddl::launcher {

namespace {

std::string short_name(const std::string& host) { return host.substr(0, host.find('.')); }

bool is_address(const std::string& host) {
  unsigned char bytes[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), bytes) == 1 || ::inet_pton(AF_INET6, host.c_str(), bytes) == 1;
}

// The same name, or the same short name (nid001 and nid001.chn.site.gov); addresses only the same.
bool same_host(const std::string& a, const std::string& b) {
  return a == b || (!is_address(a) && !is_address(b) && short_name(a) == short_name(b));
}

std::vector<std::string> split_at_commas(const std::string& value) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t comma = 0; (comma = value.find(',', start)) != std::string::npos; start = comma + 1)
    parts.push_back(value.substr(start, comma - start));
  parts.push_back(value.substr(start));
  return parts;
}

std::string without_blanks_around(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  return first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The first few names, then how many more: an allocation may hold thousands of nodes.
std::string listed(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  if (names.size() <= kShown) return fmt::format("{}", fmt::join(names, ","));
  return fmt::format("{},... ({} in all)", fmt::join(names.begin(), names.begin() + kShown, ","), names.size());
}

}  // namespace

HostExclusion::HostExclusion(const std::string& value, const RangeExpander& expand) {
  const bool has_range = value.find('[') != std::string::npos;
  if (has_range && !expand)
    throw UsageError(fmt::format("--exclude {}: a node range is read by Slurm for the nodes of a Slurm allocation only", value),
                     "name the hosts one by one: --exclude node1,node2");
  std::vector<std::string> names;
  if (has_range) {
    try {
      names = expand(value);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--exclude {}: not a Slurm node list ({})", value, e.what()),
                       "give names or ranges such as nid[001-004], separated by commas");
    }
  } else {
    names = split_at_commas(value);
  }
  for (const auto& given : names) {
    const std::string name = without_blanks_around(given);
    if (const auto colon = name.find(':'); colon != std::string::npos && valid_host_name(name.substr(0, colon)))
      throw UsageError(fmt::format("--exclude {}: a host name, without -H's slot count", name),
                       fmt::format("give --exclude {}", name.substr(0, colon)));
    if (!valid_host_name(name))
      throw UsageError(fmt::format("--exclude '{}': '{}' is not a host name", value, name),
                       "give host names separated by commas: --exclude node3,node7");
    names_.push_back(name);
  }
}

bool HostExclusion::covers(const std::string& host) const {
  return std::any_of(names_.begin(), names_.end(), [&](const std::string& name) { return same_host(name, host); });
}

std::vector<std::string> HostExclusion::hosts_left(const std::vector<std::string>& hosts, const std::string& what,
                                                   const std::function<void(const std::string&)>& note) const {
  std::vector<std::string> left;
  std::copy_if(hosts.begin(), hosts.end(), std::back_inserter(left), [&](const std::string& host) { return !covers(host); });
  if (left.empty())
    throw UsageError(fmt::format("--exclude {} leaves none of {} ({})", listed(names_), what, listed(hosts)),
                     "exclude fewer hosts, or run where there are others");
  std::vector<std::string> unmatched;
  for (const auto& name : names_)
    if (std::none_of(hosts.begin(), hosts.end(), [&](const std::string& host) { return same_host(name, host); })) unmatched.push_back(name);
  if (!unmatched.empty() && note)
    note(fmt::format("--exclude {}: not among {} ({}); nothing to leave out for it", listed(unmatched), what, listed(hosts)));
  if (left.size() < hosts.size() && note)
    note(fmt::format("leaving out {} of {}: running on {}", hosts.size() - left.size(), what, listed(left)));
  return left;
}

std::vector<HostSlots> HostExclusion::hosts_left(const std::vector<HostSlots>& hosts, const std::string& what,
                                                 const std::function<void(const std::string&)>& note) const {
  std::vector<std::string> names;
  names.reserve(hosts.size());
  for (const auto& host : hosts) names.push_back(host.name);
  const auto left = hosts_left(names, what, note);
  std::vector<HostSlots> kept;
  for (const auto& host : hosts)
    if (std::find(left.begin(), left.end(), host.name) != left.end()) kept.push_back(host);
  return kept;
}

}  // namespace ddl::launcher
