// The worker environment contract (DESIGN.md): the variables `ddl run` gives every worker and the
// libddl settings both sides read, named once here with their defaults and bounds. The launcher
// writes and checks them, libddl reads them; neither spells one as a literal of its own.
#pragma once

#include <string_view>

namespace ddl::contract {

// Set by `ddl run` for every worker.
inline constexpr const char* kRank = "DDL_RANK";                   // global rank
inline constexpr const char* kSize = "DDL_SIZE";                   // world size
inline constexpr const char* kLocalRank = "DDL_LOCAL_RANK";        // rank on this node
inline constexpr const char* kLocalSize = "DDL_LOCAL_SIZE";        // workers on this node
inline constexpr const char* kNodeRank = "DDL_NODE_RANK";          // node index
inline constexpr const char* kNumNodes = "DDL_NUM_NODES";          // node count
inline constexpr const char* kStoreAddr = "DDL_STORE_ADDR";        // host:port of the rendezvous store
inline constexpr const char* kStoreToken = "DDL_STORE_TOKEN";      // the per-run secret the store demands
inline constexpr const char* kRunId = "DDL_RUN_ID";                // this run's id (job id + step under a scheduler)
inline constexpr const char* kRequeueCount = "DDL_REQUEUE_COUNT";  // how often the batch job was requeued (Slurm's SLURM_RESTART_COUNT)
inline constexpr const char* kArrayIndex =
    "DDL_ARRAY_INDEX";  // in a job array: this element's index (SLURM_ARRAY_TASK_ID, PBS_ARRAY_INDEX)

// Set by the supervisor that starts the worker (ddl run, a host's agent, ddl exec), for its hang
// watchdog: the folder where each rank leaves signs of life and its stacks, and the signal that asks
// for them. In the folder, libddl touches "rank.N.progress" when ops complete (once a second at
// most), and ddl's Python start-up hook registers faulthandler for the signal with its output in
// "rank.N.PID.stacks"; the supervisor signals only the processes that left such a file.
inline constexpr const char* kWatchDir = "DDL_WATCH_DIR";
inline constexpr const char* kStacksSignal = "DDL_STACKS_SIGNAL";
// `ddl run --report-stragglers [N]`: rank 0's libddl reports which ranks the others waited for, at
// the end, and every N seconds when N > 0. Unset: nothing is tracked.
inline constexpr const char* kReportStragglers = "DDL_REPORT_STRAGGLERS";

// A numeric setting of libddl: the user's, checked alike by `ddl run` before it starts anything and
// by libddl in every worker (number_from_environment).
struct NumberSetting {
  const char* name;
  double fallback;  // when unset or empty
  double minimum, maximum;
};
// Seconds every wait on a peer may last (the bounds are checked by timeout_setting: more than 0).
inline constexpr NumberSetting kTimeout{"DDL_TIMEOUT", 300, 0, 365.0 * 24 * 3600};
// The negotiation period.
inline constexpr NumberSetting kCycleTimeMs{"DDL_CYCLE_TIME_MS", 1, 0, 60'000};
// The largest fusion buffer in bytes (0: no fusion).
inline constexpr NumberSetting kFusionThreshold{"DDL_FUSION_THRESHOLD", 64.0 * 1024 * 1024, 0, 0x1p40};

// libddl's other settings, read by name only.
inline constexpr const char* kTimeline = "DDL_TIMELINE";    // file.json: a Chrome trace of every op
inline constexpr const char* kBootstrap = "DDL_BOOTSTRAP";  // store, pmix or single
inline constexpr const char* kShm = "DDL_SHM";              // 0: no shared memory between ranks
inline constexpr const char* kGlooAddr = "DDL_GLOO_ADDR";   // the address peers reach this rank at
// On (flag_on): CUDA ops go through host memory and the host transports, not NCCL (as they do
// anyway where ranks share a GPU or NCCL does not load on some rank).
inline constexpr const char* kCudaViaHost = "DDL_CUDA_VIA_HOST";
// A flag setting's value: on when set to anything but empty or "0".
inline constexpr bool flag_on(std::string_view value) { return !value.empty() && value != "0"; }

}  // namespace ddl::contract
