#include "launcher/preflight.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <charconv>
#include <csignal>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launcher/host.hpp"
#include "launcher/install_layout.hpp"

namespace ddl::launcher {

namespace {

constexpr const char* kVerdictPrefix = "ddl-preflight: ";

// What the probe does now, said if it takes too long (a wedged GPU can block cuInit for ever).
const char* volatile current_step = "starting";
char verdict_start[512];

extern "C" void on_probe_deadline(int) {
  // Only async-signal-safe calls: the line is put together from what was prepared before.
  const char* parts[] = {verdict_start, "timed out in ", current_step, "\n"};
  for (const char* part : parts) {
    size_t length = 0;
    while (part[length] != '\0') ++length;
    if (::write(STDOUT_FILENO, part, length) < 0) break;
  }
  ::_exit(0);
}

// The CUDA driver's calls the probe makes, loaded from libcuda (the driver: on every GPU node).
struct CudaDriver {
  using Result = int;
  Result (*init)(unsigned) = nullptr;
  Result (*device_get_count)(int*) = nullptr;
  Result (*device_get)(int*, int) = nullptr;
  Result (*primary_ctx_retain)(void**, int) = nullptr;
  Result (*ctx_set_current)(void*) = nullptr;
  Result (*mem_alloc)(unsigned long long*, size_t) = nullptr;
  Result (*memset_d8)(unsigned long long, unsigned char, size_t) = nullptr;
  Result (*ctx_synchronize)() = nullptr;
  Result (*mem_free)(unsigned long long) = nullptr;
  Result (*error_name)(Result, const char**) = nullptr;

  std::string failure(const char* call, Result result) const {
    const char* name = nullptr;
    if (error_name != nullptr) error_name(result, &name);
    return fmt::format("{} returned {}", call, name != nullptr ? name : std::to_string(result));
  }
};

template <typename F>
bool load(void* library, const char* symbol, F& function) {
  function = reinterpret_cast<F>(::dlsym(library, symbol));
  return function != nullptr;
}

// A context on the worker's GPU (the first it sees: ddl pins one per worker), a MiB of device
// memory set and synchronized: what a bad GPU (ECC errors, a lost device, a full memory) fails.
std::optional<std::string> check_cuda_context() {
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return fmt::format("the CUDA driver does not load ({})", why != nullptr ? why : "libcuda.so.1");
  }
  CudaDriver cu;
  load(library, "cuGetErrorName", cu.error_name);
  if (!load(library, "cuInit", cu.init) || !load(library, "cuDeviceGetCount", cu.device_get_count) ||
      !load(library, "cuDeviceGet", cu.device_get) || !load(library, "cuDevicePrimaryCtxRetain", cu.primary_ctx_retain) ||
      !load(library, "cuCtxSetCurrent", cu.ctx_set_current) || !load(library, "cuMemAlloc_v2", cu.mem_alloc) ||
      !load(library, "cuMemsetD8_v2", cu.memset_d8) || !load(library, "cuCtxSynchronize", cu.ctx_synchronize) ||
      !load(library, "cuMemFree_v2", cu.mem_free))
    return "libcuda.so.1 lacks a call of the CUDA driver API";
  current_step = "cuInit";
  if (int r = cu.init(0); r != 0) return cu.failure("cuInit", r);
  int count = 0;
  if (int r = cu.device_get_count(&count); r != 0) return cu.failure("cuDeviceGetCount", r);
  if (count == 0) return "no GPU is visible (CUDA_VISIBLE_DEVICES names none this node has)";
  int device = 0;
  if (int r = cu.device_get(&device, 0); r != 0) return cu.failure("cuDeviceGet", r);
  void* context = nullptr;
  current_step = "making a CUDA context";
  if (int r = cu.primary_ctx_retain(&context, device); r != 0) return cu.failure("cuDevicePrimaryCtxRetain", r);
  if (int r = cu.ctx_set_current(context); r != 0) return cu.failure("cuCtxSetCurrent", r);
  constexpr size_t kBytes = 1 << 20;
  unsigned long long memory = 0;
  current_step = "setting device memory";
  if (int r = cu.mem_alloc(&memory, kBytes); r != 0) return cu.failure("cuMemAlloc", r);
  if (int r = cu.memset_d8(memory, 1, kBytes); r != 0) return cu.failure("cuMemsetD8", r);
  if (int r = cu.ctx_synchronize(); r != 0) return cu.failure("cuCtxSynchronize", r);
  cu.mem_free(memory);
  return std::nullopt;
}

// libddl's calls the probe makes.
struct Libddl {
  int (*init)() = nullptr;
  int (*finalize)() = nullptr;
  int (*size)(int*) = nullptr;
  int (*allreduce)(const char*, const void*, void*, size_t, int, int) = nullptr;
  const char* (*last_error)() = nullptr;
};

// This worker's libddl, loaded with the calls the probe makes: a broken installation or file
// system fails here. Throws nothing; `why` says what failed.
std::optional<Libddl> load_libddl(const Environment& env, std::string& why) {
  std::string failures;
  void* library = open_libddl(env, "ddl_init", failures);
  if (library == nullptr) {
    why = "libddl does not load: " + failures;
    return std::nullopt;
  }
  Libddl ddl;
  if (!load(library, "ddl_init", ddl.init) || !load(library, "ddl_finalize", ddl.finalize) || !load(library, "ddl_size", ddl.size) ||
      !load(library, "ddl_allreduce", ddl.allreduce) || !load(library, "ddl_last_error", ddl.last_error)) {
    why = "libddl lacks a call of its C API (an older libddl?)";
    return std::nullopt;
  }
  return ddl;
}

// libddl's start-up (the run's store, shared memory, Gloo) and one allreduce of every rank's 1:
// what a broken network or /dev/shm fails. `ranks` gets the world's size.
std::optional<std::string> check_allreduce(const Libddl& ddl, int& ranks) {
  constexpr int kFloat64 = 3, kSum = 0;  // DDL_FLOAT64, DDL_SUM of ddl.h
  if (ddl.init() != 0) return fmt::format("libddl's start-up: {}", ddl.last_error());
  ddl.size(&ranks);
  const double one = 1;
  double sum = 0;
  std::optional<std::string> failure;
  if (ddl.allreduce("ddl.preflight", &one, &sum, 1, kFloat64, kSum) != 0)
    failure = fmt::format("libddl's allreduce: {}", ddl.last_error());
  else if (sum != ranks)
    failure = fmt::format("libddl's allreduce of every rank's 1 gave {}, not {}", sum, ranks);
  ddl.finalize();
  return failure;
}

// ddl pins one GPU per GPU worker (CUDA_VISIBLE_DEVICES); a CPU worker was told so (--cpu).
std::optional<std::string> pinned_gpu(bool cpu, const Environment& env) {
  auto visible = lookup(env, "CUDA_VISIBLE_DEVICES");
  if (cpu || !visible || visible->empty()) return std::nullopt;
  return *visible;
}

}  // namespace

int run_preflight_probe(ProbeStage stage, bool cpu, const Environment& env) {
  const std::string host = host_name();
  const std::string node = lookup(env, "GROUP_RANK").value_or("?");
  std::snprintf(verdict_start, sizeof verdict_start, "%sfailed on %s [node %s]: ", kVerdictPrefix, host.c_str(), node.c_str());
  std::signal(SIGALRM, on_probe_deadline);
  ::alarm(kProbeStepSeconds);
  std::vector<std::string> failures, passed;
  if (auto gpu = pinned_gpu(cpu, env); gpu && stage == ProbeStage::OnEachHost) {
    if (auto why = check_cuda_context())
      failures.push_back(fmt::format("GPU {}: {}", *gpu, *why));
    else
      passed.push_back(fmt::format("a CUDA context on GPU {}", *gpu));
  }
  current_step = stage == ProbeStage::OnEachHost ? "loading libddl" : "libddl's start-up and allreduce";
  ::alarm(kProbeStepSeconds);
  std::string why;
  if (auto ddl = load_libddl(env, why); !ddl) {
    failures.push_back(why);
  } else if (stage == ProbeStage::OnEachHost) {
    passed.emplace_back("libddl loads");
  } else {
    int ranks = 0;
    if (auto failed = check_allreduce(*ddl, ranks))
      failures.push_back(*failed);
    else
      passed.push_back(fmt::format("libddl's allreduce among {} ranks", ranks));
  }
  ::alarm(0);
  if (failures.empty())
    std::printf("%sok on %s [node %s]: %s\n", kVerdictPrefix, host.c_str(), node.c_str(),
                fmt::format("{}", fmt::join(passed, ", ")).c_str());
  else
    std::printf("%s%s\n", verdict_start, fmt::format("{}", fmt::join(failures, "; ")).c_str());
  std::fflush(stdout);
  return 0;
}

std::optional<ProbeVerdict> probe_verdict(const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with(kVerdictPrefix)) continue;
    std::string_view rest = std::string_view(line).substr(std::string_view(kVerdictPrefix).size());
    ProbeVerdict verdict;
    verdict.ok = rest.starts_with("ok on ");
    if (!verdict.ok && !rest.starts_with("failed on ")) continue;
    rest.remove_prefix(verdict.ok ? 6 : 10);
    const size_t node = rest.find(" [node ");
    const size_t colon = rest.find("]: ");
    if (node == std::string_view::npos || colon == std::string_view::npos || colon < node) continue;
    verdict.host = rest.substr(0, node);
    const std::string_view digits = rest.substr(node + 7, colon - node - 7);
    if (std::from_chars(digits.data(), digits.data() + digits.size(), verdict.node).ptr != digits.data() + digits.size()) verdict.node = -1;
    verdict.detail = rest.substr(colon + 3);
    return verdict;
  }
  return std::nullopt;
}

PreflightFindings read_probe_outputs(const std::string& dir, const std::function<std::string(const ProbeVerdict&)>& host_of) {
  std::map<int, std::string> outputs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    if (std::sscanf(name.c_str(), "rank.%d.out", &rank) != 1 || name != fmt::format("rank.{}.out", rank)) continue;
    std::ifstream file(entry.path());
    outputs[rank] = std::string(std::istreambuf_iterator<char>(file), {});
  }
  PreflightFindings found;
  for (const auto& [rank, output] : outputs) {
    const auto verdict = probe_verdict(output);
    if (!verdict) {
      found.ranks_unheard.push_back(rank);
      continue;
    }
    const std::string host = host_of ? host_of(*verdict) : verdict->host;
    if (!verdict->ok) {
      found.failed_hosts.emplace(host, verdict->detail);
    } else {
      ++found.ranks_passed;
      if (std::find(found.hosts_passed.begin(), found.hosts_passed.end(), host) == found.hosts_passed.end())
        found.hosts_passed.push_back(host);
    }
  }
  return found;
}

}  // namespace ddl::launcher
