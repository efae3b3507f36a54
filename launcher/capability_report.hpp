// `ddl check-build`: what this build and this machine can do — build features, the frameworks of
// the active Python, launchers and schedulers, tensor operations, GPUs, the allocation we are in,
// and the site profile that matches. Every probe runs with a timeout; a missing or broken piece
// becomes an unchecked item with the reason, never an error.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/environment.hpp"

namespace ddl::launcher {

struct CapabilityItem {
  bool ok = false;
  std::string name;     // "NCCL"
  std::string version;  // "2.28.9", or empty
  std::string detail;   // "compiled; no GPU visible"
};

struct CapabilitySection {
  std::string title;  // "Build", "Frameworks (/usr/bin/python3)"
  std::vector<CapabilityItem> items;
};

// The Python to probe when none is named: the one beside this ddl when ddl was installed into a venv
// or conda env (its bin/python3), else python3 from PATH.
std::string default_python();

struct CapabilityOptions {
  std::string python = default_python();   // whose frameworks to probe
  std::chrono::seconds probe_timeout{60};  // per framework import
};

std::vector<CapabilitySection> capability_report(const Environment& env, const CapabilityOptions& options);

// The report as JSON: {"ddl": version, "sections": [{"title", "items": [{ok, name, version, detail}]}]}.
nlohmann::json capability_json(const std::vector<CapabilitySection>& report);

}  // namespace ddl::launcher
