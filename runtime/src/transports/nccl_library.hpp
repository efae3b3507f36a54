// NCCL, loaded at run time rather than linked: libddl has no DT_NEEDED on libnccl, so a process
// that already holds an NCCL (torch's, from pip's nvidia-nccl-cu* wheel) uses that one, and a
// build needs only nccl.h. The library is looked for once, on first use, in this order:
//   1. the file DDL_NCCL_LIBRARY names (when set it must load: no quiet fallback),
//   2. an NCCL already loaded in the process (any object named libnccl.so*),
//   3. libnccl.so.2 on the loader's search path (LD_LIBRARY_PATH, libddl's RUNPATH, ld.so.cache).
#pragma once

#include <string>

#if DDL_WITH_NCCL
#include <nccl.h>
#endif

namespace ddl::runtime {

// What the loader found. Without NCCL in the build, nothing is loaded and `error` says so.
struct NcclLibrary {
  bool loaded = false;
  std::string version;  // "2.28.9": what ncclGetVersion says
  std::string path;     // the file it came from
  std::string origin;   // "DDL_NCCL_LIBRARY", "already loaded" or "loader path"
  bool named = false;   // DDL_NCCL_LIBRARY is set: that file or no NCCL (no fallback), loaded or not
  std::string error;    // when not loaded: why, and what to set or load
#if DDL_WITH_NCCL
  // The entry points libddl calls (ncclAllReduce as api.AllReduce); all set when `loaded`.
// clang-format off
#define DDL_NCCL_ENTRY_POINTS(X) \
  X(GetVersion) X(GetErrorString) X(GetUniqueId) X(CommInitRank) X(CommDestroy) X(CommAbort) \
  X(CommGetAsyncError) X(AllReduce) X(Broadcast) X(AllGather) X(ReduceScatter) X(Send) X(Recv) \
  X(GroupStart) X(GroupEnd)
  // clang-format on
  struct Api {
#define DDL_NCCL_FIELD(name) decltype(&::nccl##name) name = nullptr;
    DDL_NCCL_ENTRY_POINTS(DDL_NCCL_FIELD)
#undef DDL_NCCL_FIELD
  } api;
#endif
};

// The process's NCCL: looked for on the first call (thread-safe), the same answer afterwards.
const NcclLibrary& nccl_library();

#if DDL_WITH_NCCL
// The entry points, or ddl::Error with nccl_library().error when no NCCL could be loaded.
const NcclLibrary::Api& nccl_api();
#endif

// "2.28.9" from ncclGetVersion's code (22809; before 2.9: 2708 for 2.7.8).
std::string nccl_version_string(int code);

}  // namespace ddl::runtime
