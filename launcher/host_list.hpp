// The hosts of `ddl run -H` and `--hostfile`, in the forms horovodrun, mpirun and deepspeed take.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddl::launcher {

// Letters, digits, '.', '-' and '_', not starting with '-': all a host name may hold here, since
// anything else would reach the remote shell's command line.
bool valid_host_name(std::string_view name);

struct HostSlots {
  std::string name;
  int slots = 1;  // workers the host may run
};

// "a:4,b:4" (horovodrun), "a,a,b" (mpirun: each mention is a slot), or a mix; a host named twice
// has the sum of its slots, in the order of its first mention. Throws UsageError naming -H.
std::vector<HostSlots> parse_host_flag(const std::string& value);

// A host file: one host per line as "host slots=N" (mpirun, deepspeed), "host:N" (horovodrun) or
// "host" (one slot); "max_slots=" is accepted and ignored; '#' starts a comment. Throws
// UsageError naming the file and line.
std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& path);
std::vector<HostSlots> read_hostfile(const std::string& path);

}  // namespace ddl::launcher
