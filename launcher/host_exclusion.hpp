// The hosts `ddl run --exclude` leaves out of a run on several hosts (-H/--hostfile, or the nodes
// of a Slurm or PBS allocation): a node with a bad GPU or network, found after the queue wait.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/host_list.hpp"

namespace ddl::launcher {

class HostExclusion {
 public:
  // Expands a Slurm node range ("nid[001-004]") into host names; empty where there is none to ask.
  using RangeExpander = std::function<std::vector<std::string>(const std::string&)>;

  HostExclusion() = default;
  // `value` is --exclude's: host names separated by commas, or Slurm node ranges where `expand` is
  // given. Throws UsageError naming --exclude for an empty name, or a range with nothing to expand it.
  HostExclusion(const std::string& value, const RangeExpander& expand);

  bool empty() const { return names_.empty(); }
  const std::vector<std::string>& names() const { return names_; }

  // Whether `host` is one of the names, or has the same short name (nid001 and nid001.chn.site.gov).
  bool covers(const std::string& host) const;

  // `hosts` less the excluded ones, in their order. Throws UsageError when none is left;
  // `what` names the list in that message ("the hosts of -H", "Slurm job 42's nodes"). Names that
  // match none of `hosts` are said through `note` (a list of a site's known bad nodes is normal).
  std::vector<std::string> hosts_left(const std::vector<std::string>& hosts, const std::string& what,
                                      const std::function<void(const std::string&)>& note) const;
  std::vector<HostSlots> hosts_left(const std::vector<HostSlots>& hosts, const std::string& what,
                                    const std::function<void(const std::string&)>& note) const;

 private:
  std::vector<std::string> names_;
};

}  // namespace ddl::launcher
