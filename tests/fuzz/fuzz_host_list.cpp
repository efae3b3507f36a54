// Fuzz target `host_list`: `ddl run -H` and `--hostfile` parsing (launcher/host_list):
// parse_host_flag and parse_hostfile_text, both on the whole input.
//
// ddl::UsageError is their answer to a bad list; any other exception, a crash or a sanitizer
// report is a finding. Oracle: a parsed list is not empty, names each host once, with a name of
// letters, digits, '.', '-' and '_' (nothing a remote shell would read as syntax) and 1 to 2^20
// slots.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "launcher/host_list.hpp"

using ddl::launcher::HostSlots;

namespace {

void check(const std::vector<HostSlots>& hosts, const char* what) {
  auto fail = [&](const char* why, const std::string& name) {
    std::fprintf(stderr, "fuzz_host_list: %s: %s: '%s'\n", what, why, name.c_str());
    std::abort();
  };
  if (hosts.empty()) fail("an empty list", "");
  std::set<std::string> seen;
  for (const auto& h : hosts) {
    if (h.name.empty() || h.name.size() > 253 || h.name.front() == '-') fail("a host name of bad shape", h.name);
    for (char c : h.name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
        fail("a host name with a stray character", h.name);
    if (h.slots < 1 || h.slots > (1 << 20)) fail("a slot count out of range", h.name);
    if (!seen.insert(h.name).second) fail("a host named twice", h.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    check(ddl::launcher::parse_host_flag(text), "-H");
  } catch (const ddl::UsageError&) {}
  try {
    check(ddl::launcher::parse_hostfile_text(text, "fuzz-hostfile"), "--hostfile");
  } catch (const ddl::UsageError&) {}
  return 0;
}
