// The batch schedulers ddl knows, and their names: "Slurm" in messages, "slurm" in site profiles
// and session files.
#pragma once

#include <optional>
#include <string_view>

namespace ddl::backends {

enum class Scheduler { None, Slurm, Pbs };

// "Slurm", "PBS" (for messages); "none".
const char* scheduler_name(Scheduler s);
// "slurm", "pbs": the word a site profile's `scheduler` field holds; "none".
const char* scheduler_key(Scheduler s);
// The scheduler a profile word names ("slurm", "pbs"); nullopt for anything else.
std::optional<Scheduler> scheduler_from_key(std::string_view key);

}  // namespace ddl::backends
