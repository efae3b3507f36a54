#include "launcher/host_exclusion.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"

namespace ddl::launcher {

namespace {

std::string short_name(const std::string& host) { return host.substr(0, host.find('.')); }

bool same_host(const std::string& a, const std::string& b) { return a == b || short_name(a) == short_name(b); }

std::vector<std::string> split_at_commas(const std::string& value) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t comma; (comma = value.find(',', start)) != std::string::npos; start = comma + 1)
    parts.push_back(value.substr(start, comma - start));
  parts.push_back(value.substr(start));
  return parts;
}

std::string joined(const std::vector<std::string>& names) { return fmt::format("{}", fmt::join(names, ",")); }

}  // namespace

HostExclusion::HostExclusion(const std::string& value, const RangeExpander& expand) {
  const bool has_range = value.find('[') != std::string::npos;
  if (has_range && !expand)
    throw UsageError(fmt::format("--exclude {}: a node range is expanded by Slurm, and this run is not in a Slurm job", value),
                     "name the hosts one by one: --exclude node1,node2");
  for (const auto& name : has_range ? expand(value) : split_at_commas(value)) {
    if (name.empty() || name.find_first_of(" \t\n") != std::string::npos)
      throw UsageError(fmt::format("--exclude '{}': an empty or blank host name", value),
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
    throw UsageError(fmt::format("--exclude {} leaves none of {} ({})", joined(names_), what, joined(hosts)),
                     "exclude fewer hosts, or run where there are others");
  std::vector<std::string> unmatched;
  for (const auto& name : names_)
    if (std::none_of(hosts.begin(), hosts.end(), [&](const std::string& host) { return same_host(name, host); }))
      unmatched.push_back(name);
  if (!unmatched.empty() && note)
    note(fmt::format("--exclude {}: not among {} ({}); nothing to leave out for it", joined(unmatched), what, joined(hosts)));
  if (left.size() < hosts.size() && note)
    note(fmt::format("leaving out {} of {}: running on {}", hosts.size() - left.size(), what, joined(left)));
  return left;
}

std::vector<HostSlots> HostExclusion::hosts_left(const std::vector<HostSlots>& hosts, const std::string& what,
                                                 const std::function<void(const std::string&)>& note) const {
  std::vector<std::string> names;
  for (const auto& host : hosts) names.push_back(host.name);
  const auto left = hosts_left(names, what, note);
  std::vector<HostSlots> kept;
  for (const auto& host : hosts)
    if (std::find(left.begin(), left.end(), host.name) != left.end()) kept.push_back(host);
  return kept;
}

}  // namespace ddl::launcher
