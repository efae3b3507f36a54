#include "backends/scheduler.hpp"

namespace ddl::backends {

const char* scheduler_name(Scheduler s) {
  switch (s) {
    case Scheduler::Slurm: return "Slurm";
    case Scheduler::Pbs: return "PBS";
    case Scheduler::None: break;
  }
  return "none";
}

const char* scheduler_key(Scheduler s) {
  switch (s) {
    case Scheduler::Slurm: return "slurm";
    case Scheduler::Pbs: return "pbs";
    case Scheduler::None: break;
  }
  return "none";
}

std::optional<Scheduler> scheduler_from_key(std::string_view key) {
  if (key == "slurm") return Scheduler::Slurm;
  if (key == "pbs") return Scheduler::Pbs;
  return std::nullopt;
}

}  // namespace ddl::backends
