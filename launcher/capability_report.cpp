#include "launcher/capability_report.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "backends/allocation.hpp"
#include "backends/command.hpp"
#include "backends/site_profile.hpp"
#include "backends/slurm/slurm_launch.hpp"
#include "common/worker_contract.hpp"
#include "ddl/build_features.hpp"
#include "launcher/gpu_inventory.hpp"
#include "launcher/host.hpp"
#include "launcher/install_layout.hpp"
#include "launcher/nccl_network.hpp"

namespace ddl::launcher {

std::string default_python() {
  const auto beside = std::filesystem::path(this_executable()).parent_path() / "python3";
  return ::access(beside.c_str(), X_OK) == 0 ? beside.string() : "python3";
}

namespace {

using backends::CommandResult;
using backends::run_command;
using std::chrono::seconds;

using backends::first_line;
using backends::last_line;

// The first "N.N[.N]" in the start of `text` (a tool's --version). Only the start is searched, and
// the numbers are bounded: std::regex recurses once per character it matches.
std::string version_in(const std::string& text) {
  constexpr size_t kSearched = 1024;
  static const std::regex version(R"((\d{1,9}\.\d{1,9}(\.\d{1,9})?))");
  const std::string start = text.substr(0, kSearched);
  std::smatch m;
  return std::regex_search(start, m, version) ? m[1].str() : std::string();
}

CapabilityItem item(bool ok, std::string name, std::string version, std::string detail) {
  return {ok, std::move(name), std::move(version), std::move(detail)};
}

// The NCCL libddl will use. libddl loads it at run time (DDL_NCCL_LIBRARY, one already in the
// process, libnccl.so.2 on its loader path), and only libddl's own search path says which file
// that is, so this asks this build's libddl through its C API, loaded as any program loads it
// (the launcher never links libddl). In this process nothing else has loaded an NCCL; a worker
// that imported torch first uses torch's (the ddl.torch line says which).
struct RuntimeNccl {
  bool asked = false;  // a libddl was loaded and answered
  std::string version, path, origin, error;
};

RuntimeNccl ask_libddl_for_nccl(const Environment& env) {
  RuntimeNccl answer;
  std::string why;
  void* libddl = open_libddl(env, "ddl_nccl_origin", why);  // stays loaded: it holds the NCCL it loaded
  if (libddl == nullptr) {
    answer.error = "cannot ask libddl which NCCL it loads: " + why;
    return answer;
  }
  auto text = [&](const char* function) -> std::string {
    auto f = reinterpret_cast<const char* (*)()>(::dlsym(libddl, function));
    const char* value = f != nullptr ? f() : nullptr;
    return value != nullptr ? value : "";
  };
  return {true, text("ddl_nccl_version"), text("ddl_nccl_path"), text("ddl_nccl_origin"), text("ddl_nccl_error")};
}

std::string nccl_origin_words(const std::string& origin) {
  if (origin == "DDL_NCCL_LIBRARY") return "named by DDL_NCCL_LIBRARY";
  if (origin == "loader path") return "found on the loader path (LD_LIBRARY_PATH, ld.so.cache)";
  return origin;
}

CapabilitySection build_section(const RuntimeNccl& nccl_used) {
  CapabilitySection s{"Build", {}};
  s.items.push_back(item(true, "ddl and libddl", DDL_BUILD_VERSION, fmt::format("{}, {}", DDL_BUILD_TYPE, DDL_BUILD_COMPILER)));
  const std::string nccl = DDL_BUILD_NCCL_VERSION;
  if (nccl.empty())
    s.items.push_back(item(false, "NCCL", "", "not compiled in (no CUDA toolkit with nccl.h at build time)"));
  else if (nccl_used.version.empty())
    s.items.push_back(item(false, "NCCL", "", fmt::format("built with nccl.h {}; none loads: {}", nccl, nccl_used.error)));
  else
    s.items.push_back(item(true, "NCCL", nccl_used.version,
                           fmt::format("{}, {}; built with nccl.h {}", nccl_used.path, nccl_origin_words(nccl_used.origin), nccl)));
  const std::string cuda = DDL_BUILD_CUDA_VERSION;
  s.items.push_back(cuda.empty() ? item(false, "CUDA", "", "not compiled in") : item(true, "CUDA", cuda, "compiled"));
  s.items.push_back(item(true, "Gloo", "", "compiled: host tensors, over TCP"));
  const std::string pmix = DDL_BUILD_PMIX_VERSION;
  s.items.push_back(pmix.empty() ? item(false, "PMIx", "", "not compiled in (libpmix-dev missing at build time)")
                                 : item(true, "PMIx", pmix, "compiled: bootstrap under mpirun and srun --mpi=pmix"));
  s.items.push_back(item(false, "libslurm", "", "not used: ddl runs srun, sbatch, squeue, scontrol and scancel"));
  return s;
}

// Imports one framework in a child Python and prints what it offers as one JSON line.
const std::vector<std::pair<std::string, std::string>> kFrameworkProbes = {
    {"torch",
     "import json, torch, torch.distributed as d\n"
     "nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None\n"
     "print(json.dumps({'version': torch.__version__, 'detail': 'CUDA %s%s; gloo %s; nccl %s; mpi %s' % ("
     "torch.version.cuda or 'none', '' if torch.cuda.is_available() else ' (no GPU usable)', "
     "'yes' if d.is_gloo_available() else 'no', ('yes ' + '.'.join(map(str, nccl)) if isinstance(nccl, tuple) else 'yes') "
     "if d.is_nccl_available() else 'no', 'yes' if d.is_mpi_available() else 'no')}))"},
    {"tensorflow",
     "import json, os\nos.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\nimport tensorflow as tf\n"
     "print(json.dumps({'version': tf.__version__, 'detail': 'Keras %s; %d GPU(s) visible' % ("
     "getattr(tf.keras, '__version__', None) or __import__('keras').__version__, len(tf.config.list_physical_devices('GPU')))}))"},
    {"lightning",
     "import json\ntry:\n    import lightning as L\nexcept ImportError:\n    import pytorch_lightning as L\n"
     "print(json.dumps({'version': L.__version__, 'detail': L.__name__}))"},
    {"horovod",
     "import json, horovod\ndetail = ''\ntry:\n    import horovod.torch as hvd\n"
     "    detail = 'nccl %s; gloo %s; mpi %s' % (hvd.nccl_built(), hvd.gloo_built(), hvd.mpi_built())\nexcept Exception as e:\n"
     "    detail = 'horovod.torch: %s' % e\nprint(json.dumps({'version': horovod.__version__, 'detail': detail}))"},
};

// The module a Python "No module named 'x.y'" error names, or "" for another error.
std::string missing_module(const std::string& error_text) {
  const std::string sign = "No module named '";
  const size_t from = error_text.find(sign);
  if (from == std::string::npos) return {};
  const size_t start = from + sign.size();
  const size_t end = error_text.find('\'', start);
  return end == std::string::npos || end == start ? std::string() : error_text.substr(start, end - start);
}

std::string top_level(const std::string& module) { return module.substr(0, module.find('.')); }

// Why `name` does not import when the import of `missing` failed: the piece itself is absent (the
// old Lightning's name is pytorch_lightning), or it is there and needs another one (ddl.torch
// without torch), which must be named: "not installed" would send the user to reinstall ddl.
std::string missing_piece_words(const std::string& name, const std::string& missing, const std::string& python) {
  if (missing == "ddl.capabilities")  // the package found predates the probe: it is there, but not this ddl's
    return fmt::format("an older ddl package, without ddl.capabilities: install this ddl's package for {}", python);
  const bool itself = top_level(missing) == top_level(name) || (name == "lightning" && missing == "pytorch_lightning");
  if (itself) return "not installed";
  return fmt::format("installed, but needs {}, which {} cannot import (No module named '{}')", top_level(missing), python, missing);
}

CapabilityItem probe_framework(const std::string& python, const std::string& name, const std::string& code, seconds timeout) {
  CommandResult r = run_command({python, "-c", code}, timeout);
  if (r.exit_code == -1 && r.err.find("timed out") != std::string::npos)
    return item(false, name, "", fmt::format("importing it took more than {} s; not probed further", timeout.count()));
  if (r.exit_code != 0) {
    if (const std::string missing = missing_module(r.err); !missing.empty())
      return item(false, name, "", missing_piece_words(name, missing, python));
    const std::string last = last_line(r.err);
    return item(false, name, "", "import failed: " + (last.empty() ? "exit " + std::to_string(r.exit_code) : last));
  }
  auto j = nlohmann::json::parse(first_line(r.out), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return item(false, name, "", "the probe printed no answer");
  // A module may carry any __version__ (a number, None): shown as text, never a type error.
  const auto text = [&](const char* field) {
    if (!j.contains(field) || j[field].is_null()) return std::string();
    return j[field].is_string() ? j[field].get<std::string>() : j[field].dump();
  };
  return item(true, name, text("version"), text("detail"));
}

// The probe of one of ddl's faces: ddl's package is put on the path from beside this ddl (where its
// layout puts it), then the package's public probe (ddl.capabilities) answers as one JSON line. A
// folder of one Python version (PREFIX/lib/python3.X/site-packages) is taken only by that Python and
// after the Python's own path, so that it never lends the probed Python another version's torch.
std::string ddl_face_probe(const std::string& face) {
  nlohmann::json folders = python_package_folders(this_executable());
  return fmt::format(
      "import os, sys\n"
      "mine, first = 'python%d.%d' % sys.version_info[:2], 0\n"
      "for p in {}:\n"
      "    if not os.path.isdir(os.path.join(p, 'ddl')): continue\n"
      "    version = os.path.basename(os.path.dirname(p))\n"
      "    if not version.startswith('python3.'): sys.path.insert(first, p); first += 1\n"
      "    elif version == mine: sys.path.append(p)\n"
      "import ddl.capabilities as capabilities\n"
      "sys.exit(capabilities.main([{}]))",
      folders.dump(), nlohmann::json(face).dump());
}

CapabilitySection frameworks_section(const CapabilityOptions& options) {
  // As JSON: the executable's path may hold blanks (a venv under "My Projects").
  CommandResult py = run_command({options.python, "-c", "import json, sys; print(json.dumps([sys.executable, sys.version.split()[0]]))"},
                                 std::min(options.probe_timeout, std::chrono::seconds(30)));  // --probe-timeout bounds every probe
  CapabilitySection s{fmt::format("Frameworks ({})", options.python), {}};
  if (!py.ok()) {
    s.items.push_back(item(false, "Python", "", fmt::format("{} does not run: {}", options.python, first_line(py.err))));
    return s;
  }
  std::string executable = options.python, version = "?";
  const auto said = nlohmann::json::parse(first_line(py.out), nullptr, false);
  if (said.is_array() && said.size() == 2 && said[0].is_string() && said[1].is_string()) {
    if (!said[0].get<std::string>().empty()) executable = said[0].get<std::string>();  // empty where Python cannot tell
    version = said[1].get<std::string>();
  }
  s.title = fmt::format("Frameworks ({}, Python {})", executable, version);
  std::vector<std::future<CapabilityItem>> probes;  // imports are slow: all at once
  probes.reserve(kFrameworkProbes.size());
  for (const auto& [name, code] : kFrameworkProbes)
    probes.push_back(std::async(std::launch::async, probe_framework, executable, name, code, options.probe_timeout));
  probes.push_back(
      std::async(std::launch::async, probe_framework, executable, "ddl.torch", ddl_face_probe("torch"), options.probe_timeout));
  probes.push_back(
      std::async(std::launch::async, probe_framework, executable, "ddl.tensorflow", ddl_face_probe("tensorflow"), options.probe_timeout));
  for (auto& p : probes) s.items.push_back(p.get());
  return s;
}

CapabilityItem slurm_item() {
  if (!backends::on_path("srun")) return item(false, "Slurm", "", "srun not found");
  CommandResult v = run_command({"srun", "--version"}, seconds(10));
  if (!v.ok()) return item(false, "Slurm", "", "srun is here but cannot reach a Slurm: " + last_line(v.err + v.out));
  CommandResult mpi = run_command({"srun", "--mpi=list"}, seconds(10));
  // "MPI plugin types are...", then one plugin per indented line.
  std::vector<std::string> plugins;
  static const std::regex plugin(R"(^\s+([a-z0-9_]+)\s*$)");
  std::istringstream lines(mpi.out + mpi.err);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.size() <= 256 && std::regex_match(line, m, plugin)) plugins.push_back(m[1]);  // plugin names are short
  }
  return item(true, "Slurm", version_in(v.out), plugins.empty() ? "srun" : fmt::format("srun --mpi: {}", fmt::join(plugins, ", ")));
}

CapabilityItem pbs_item() {
  if (!backends::on_path("qsub")) return item(false, "PBS", "", "qsub not found");
  CommandResult v = run_command({"qstat", "--version"}, seconds(10));
  return item(true, "PBS", version_in(v.out + v.err), "qsub, qstat, qdel");
}

CapabilityItem mpi_launcher_item() {
  for (const char* launcher : {"mpiexec", "mpirun"}) {
    if (!backends::on_path(launcher)) continue;
    CommandResult v = run_command({launcher, "--version"}, seconds(10));
    const std::string said = v.out + v.err;
    std::string kind = said.find("Open MPI") != std::string::npos || said.find("OpenRTE") != std::string::npos ? "Open MPI"
                       : said.find("PALS") != std::string::npos                                                ? "Cray PALS"
                       : said.find("HYDRA") != std::string::npos                                               ? "MPICH (Hydra)"
                                                                                                               : "unknown MPI";
    return item(true, kind, version_in(said), launcher);
  }
  return item(false, "MPI launcher", "", "neither mpiexec nor mpirun found");
}

// ddl run -H starts other hosts' workers through ssh.
CapabilityItem ssh_item() {
  if (!backends::on_path("ssh")) return item(false, "ssh", "", "not found: ddl run -H/--hostfile needs it (or --rsh)");
  CommandResult v = run_command({"ssh", "-V"}, seconds(10));
  return item(true, "ssh", version_in(v.out + v.err), "ddl run -H/--hostfile starts other hosts' workers through it");
}

CapabilitySection controllers_section() {
  CapabilitySection s{"Controllers", {}};
  auto slurm = std::async(std::launch::async, slurm_item);
  auto pbs = std::async(std::launch::async, pbs_item);
  auto mpi = std::async(std::launch::async, mpi_launcher_item);
  s.items.push_back(slurm.get());
  s.items.push_back(pbs.get());
  s.items.push_back(mpi.get());
  s.items.push_back(ssh_item());
  const std::string pmix = DDL_BUILD_PMIX_VERSION;
  s.items.push_back(pmix.empty() ? item(false, "PMIx", "", "libddl was built without it")
                                 : item(true, "PMIx", pmix, "libddl bootstraps through it"));
  s.items.push_back(item(true, "ddl rendezvous store", DDL_BUILD_VERSION, "built into ddl run"));
  // libddl's world where no launcher gives one (ddl_init_with_store): ddl.torch and the "ddl" backend use it.
  s.items.push_back(item(true, "torch store", "",
                         "without a launcher's world (mp.spawn, torchrun, a plain srun), init_process_group(\"ddl\") and "
                         "ddl.torch's init() join through torch.distributed's store"));
  return s;
}

// CUDA buffers go through NCCL where every rank has a GPU of its own and NCCL loads; otherwise
// libddl runs them through host memory (agree_on_gpu_route), which a build with CUDA always can.
CapabilitySection tensor_ops_section(const Environment& env, const GpuInventory& inventory, const RuntimeNccl& nccl_used) {
  CapabilitySection s{"Tensor operations", {}};
  const std::string nccl = DDL_BUILD_NCCL_VERSION;
  const bool via_host_asked = contract::flag_on(lookup(env, contract::kCudaViaHost).value_or(""));
  if (nccl.empty())
    s.items.push_back(item(false, "NCCL", "", "not compiled in: CUDA buffers are unsupported"));
  else if (nccl_used.version.empty())
    s.items.push_back(item(false, "NCCL", "", "none loads: CUDA buffers go through host memory (slower)"));
  else if (via_host_asked)
    s.items.push_back(item(false, "NCCL", nccl_used.version,
                           fmt::format("loads, but {}=1: CUDA buffers go through host memory", contract::kCudaViaHost)));
  else
    s.items.push_back(item(inventory.count() > 0, "NCCL", nccl_used.version,
                           inventory.count() > 0 ? "CUDA buffers, one GPU per rank" : "loads; no GPU visible"));
  if (!nccl.empty())
    s.items.push_back(item(inventory.count() > 0, "CUDA via host", "",
                           fmt::format("{}CUDA buffers through host memory and the host transports where ranks share a GPU (ddl run "
                                       "--share-gpus), NCCL does not load, or {}=1: correct, slower than NCCL",
                                       inventory.count() > 0 ? "" : "no GPU visible; ", contract::kCudaViaHost)));
  s.items.push_back(item(true, "Gloo", "", "host buffers"));
  s.items.push_back(item(false, "MPI", "", "not used by libddl: NCCL on GPUs, Gloo on hosts"));
  return s;
}

// GPUs CUDA_VISIBLE_DEVICES names on a machine without an NVIDIA driver (no nvidia-smi, no
// libcuda.so.1: a login node that inherited the variable) are GPUs nothing here can use.
bool gpus_without_driver(const GpuInventory& gpus) {
  if (gpus.count() == 0 || gpus.source != "CUDA_VISIBLE_DEVICES" || backends::on_path("nvidia-smi")) return false;
  return ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr;  // (not unloaded, as gpu_inventory's)
}

CapabilitySection gpus_section(const Environment& env, const GpuInventory& gpus, bool no_driver) {
  CapabilitySection s{"GPUs", {}};
  if (backends::on_path("nvidia-smi")) {
    CommandResult r =
        run_command({"nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"}, seconds(20));
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> f;
      std::istringstream parts(line);
      for (std::string p; std::getline(parts, p, ',');) {
        const auto start = p.find_first_not_of(' ');
        f.push_back(start == std::string::npos ? std::string() : p.substr(start));
      }
      if (f.size() == 4) s.items.push_back(item(true, "GPU " + f[0], "", fmt::format("{}, {}, driver {}", f[1], f[2], f[3])));
    }
    if (!r.ok()) s.items.push_back(item(false, "nvidia-smi", "", "failed: " + first_line(r.err + r.out)));
  }
  if (s.items.empty() && no_driver) {
    s.items.push_back(item(false, fmt::format("{} GPU(s)", gpus.count()), "",
                           "named by CUDA_VISIBLE_DEVICES, but this machine has no NVIDIA driver (no nvidia-smi, no libcuda.so.1): "
                           "nothing here can use them"));
  } else if (s.items.empty()) {
    s.items.push_back(gpus.count() > 0 ? item(true, fmt::format("{} GPU(s)", gpus.count()), "", "from " + gpus.source)
                                       : item(false, "GPU", "", "none visible: " + gpus.source));
  } else if (auto cvd = lookup(env, "CUDA_VISIBLE_DEVICES")) {
    s.items.push_back(item(true, "CUDA_VISIBLE_DEVICES", "", *cvd + fmt::format(" ({} GPU(s) for ddl run)", gpus.count())));
  }
  return s;
}

CapabilitySection allocation_section(const Environment& env, const GpuInventory& inventory) {
  CapabilitySection s{"Allocation", {}};
  const backends::Allocation a = backends::detect_allocation(env);
  if (a.scheduler == backends::Scheduler::None) {
    s.items.push_back(item(false, "allocation", "", "not inside a Slurm or PBS job: ddl run starts workers on this machine"));
    return s;
  }
  std::string gpus =
      a.scheduler == backends::Scheduler::Slurm ? std::to_string(backends::slurm::gpus_per_node(env)) : std::to_string(inventory.count());
  s.items.push_back(item(true, fmt::format("{} job {}", backends::scheduler_name(a.scheduler), a.job_id), "",
                         fmt::format("{} node(s), {} GPU(s) per node", a.num_nodes, gpus)));
  return s;
}

// The network NCCL would use between nodes (nccl_network.hpp), and whether it is the one each
// matching site profile expects (Slingshot's OFI plugin): where it is not, said loudly, with the fix.
CapabilitySection nccl_network_section(const Environment& env, const std::vector<backends::ListedSite>& listed,
                                       const std::vector<std::string>& sites) {
  CapabilitySection s{"NCCL network (between nodes)", {}};
  const NcclNetwork n = inspect_nccl_network(env);
  if (n.plugins_off) s.items.push_back(item(false, "net plugin", "", "NCCL_NET_PLUGIN=none: NCCL uses its own sockets or InfiniBand"));
  if (const NetPluginCandidate* p = n.plugin())
    s.items.push_back(
        item(true, "net plugin", p->network,
             fmt::format("{} ({}), API v{}{}", p->name, p->path, fmt::join(p->net_versions, " v"),
                         p->collnet_versions.empty() ? "" : fmt::format(", CollNet v{}", fmt::join(p->collnet_versions, " v")))));
  else if (!n.plugins_off)
    for (const auto& c : n.tried)
      s.items.push_back(item(false, "net plugin " + c.name, "", fmt::format("{}: NCCL uses its own sockets or InfiniBand", c.error)));
  if (!n.on_loader_path.empty())
    s.items.push_back(item(true, "on LD_LIBRARY_PATH", "", fmt::format("{}", fmt::join(n.on_loader_path, ", "))));
  if (!n.libfabric_providers)
    s.items.push_back(item(false, "libfabric", "", "no fi_info on PATH"));
  else if (!n.fi_info_error.empty())
    s.items.push_back(item(false, "libfabric", "", n.fi_info_error));
  else
    s.items.push_back(item(!n.libfabric_providers->empty(), "libfabric", "",
                           fmt::format("providers: {} (fi_info -l)", fmt::join(*n.libfabric_providers, ", "))));
  std::vector<std::string> settings;
  for (const auto& [name, value] : n.settings) settings.push_back(fmt::format("{}={}", name, value));
  s.items.push_back(
      item(!settings.empty(), "NCCL/FI settings", "", settings.empty() ? "none set" : fmt::format("{}", fmt::join(settings, " "))));
  for (const backends::SiteProfile* site : sites_expecting_a_network(listed, sites)) {
    const std::string name = "site " + site->name + " expects " + site->nccl_network;
    const auto miss = n.misses(site->nccl_network);
    s.items.push_back(miss ? item(false, name, "", fmt::format("WARNING: {}; fix: {}", *miss, site->nccl_network_fix))
                           : item(true, name, "", "NCCL reaches it"));
  }
  return s;
}

CapabilitySection site_section(const std::string& host, const std::vector<backends::ListedSite>& listed,
                               const std::vector<std::string>& sites) {
  CapabilitySection s{"Site", {}};
  if (sites.empty())
    s.items.push_back(item(false, "site profile", "", fmt::format("none matches this machine ({}); ddl sites lists them", host)));
  for (const auto& name : sites) s.items.push_back(item(true, "site " + name, "", fmt::format("ddl submit --site {} ...", name)));
  for (const auto& site : listed)
    if (!site.profile) s.items.push_back(item(false, "site profile " + site.name, "", "broken: " + site.error));
  return s;
}

}  // namespace

std::vector<CapabilitySection> capability_report(const Environment& env, const CapabilityOptions& options) {
  auto frameworks = std::async(std::launch::async, frameworks_section, options);  // the slow one
  const GpuInventory inventory = discover_gpus(env);                              // once: it may load libcuda or run nvidia-smi
  const RuntimeNccl nccl = DDL_BUILD_NCCL_VERSION[0] != '\0' ? ask_libddl_for_nccl(env) : RuntimeNccl{};
  std::vector<CapabilitySection> report;
  report.push_back(build_section(nccl));
  auto controllers = controllers_section();
  report.push_back(frameworks.get());
  report.push_back(std::move(controllers));
  const bool no_driver = gpus_without_driver(inventory);  // asked once: it looks on PATH and loads libcuda
  report.push_back(tensor_ops_section(env, no_driver ? GpuInventory{{}, "no NVIDIA driver"} : inventory, nccl));
  const auto listed = backends::list_sites();  // every profile read once: for matching, and to name broken ones
  const std::string host = full_host_name();
  const auto sites = backends::matching_sites(listed, host, env);
  report.push_back(nccl_network_section(env, listed, sites));
  report.push_back(gpus_section(env, inventory, no_driver));
  report.push_back(allocation_section(env, inventory));
  report.push_back(site_section(host, listed, sites));
  return report;
}

nlohmann::json capability_json(const std::vector<CapabilitySection>& report) {
  nlohmann::json sections = nlohmann::json::array();
  for (const auto& section : report) {
    nlohmann::json items = nlohmann::json::array();
    for (const auto& i : section.items) items.push_back({{"ok", i.ok}, {"name", i.name}, {"version", i.version}, {"detail", i.detail}});
    sections.push_back({{"title", section.title}, {"items", items}});
  }
  return {{"ddl", DDL_BUILD_VERSION}, {"sections", sections}};
}

}  // namespace ddl::launcher
