#include "runtime/src/transports/nccl_library.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "common/error.hpp"

namespace ddl::runtime {

std::string nccl_version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
}

namespace {

#if DDL_WITH_NCCL

constexpr const char* kOverride = "DDL_NCCL_LIBRARY";
constexpr const char* kSoname = "libnccl.so.2";
constexpr const char* kWhatToDo =
    "set DDL_NCCL_LIBRARY to the path of a libnccl.so.2, put your site's NCCL on LD_LIBRARY_PATH (module load nccl), "
    "or import torch first to share its NCCL (pip's nvidia-nccl-cu* wheel)";

std::string dl_error() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

// The file a handle was loaded from (for a name found on the search path, the path it was found at).
std::string path_of(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name != '\0') return map->l_name;
  return fallback;
}

// An NCCL something else (torch) already brought into this process: the first object named libnccl.so*.
std::string already_loaded_nccl() {
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        if (info->dlpi_name == nullptr) return 0;
        std::string_view name = info->dlpi_name;
        const auto slash = name.rfind('/');
        const std::string_view base = slash == std::string_view::npos ? name : name.substr(slash + 1);
        if (base.rfind("libnccl.so", 0) != 0) return 0;
        *static_cast<std::string*>(out) = std::string(name);
        return 1;
      },
      &found);
  return found;
}

template <typename F>
void resolve(void* handle, const char* name, F& slot, std::string& missing) {
  slot = reinterpret_cast<F>(::dlsym(handle, name));
  if (slot == nullptr && missing.empty()) missing = name;
}

// Fills `lib` from an open handle; false (with lib.error) when it is not an NCCL libddl can use.
bool take(NcclLibrary& lib, void* handle, const std::string& where) {
  auto& a = lib.api;
  std::string missing;
#define DDL_NCCL_RESOLVE(name) resolve(handle, "nccl" #name, a.name, missing);
  DDL_NCCL_ENTRY_POINTS(DDL_NCCL_RESOLVE)
#undef DDL_NCCL_RESOLVE
  if (!missing.empty()) {
    lib.error = fmt::format("{} is not an NCCL libddl can use: it has no {}", where, missing);
    return false;
  }
  int code = 0;
  if (a.GetVersion(&code) != ncclSuccess) {
    lib.error = fmt::format("{}: ncclGetVersion failed", where);
    return false;
  }
  lib.version = nccl_version_string(code);
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  if (major != NCCL_MAJOR) {
    lib.error = fmt::format("{} is NCCL {}, but libddl was built against NCCL {}.x headers", where, lib.version, NCCL_MAJOR);
    return false;
  }
  lib.loaded = true;
  lib.error.clear();
  return true;
}

NcclLibrary load() {
  NcclLibrary lib;
  const char* override_path = std::getenv(kOverride);
  if (override_path != nullptr && *override_path != '\0') {
    lib.named = true;
    const std::string where = fmt::format("{}={}", kOverride, override_path);
    void* handle = ::dlopen(override_path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      lib.error = fmt::format(
          "{} cannot be loaded ({}); point it at a libnccl.so.2, or unset it to use the NCCL already in the "
          "process or libnccl.so.2 from the loader's path",
          where, dl_error());
      return lib;
    }
    lib.path = path_of(handle, override_path);
    lib.origin = kOverride;
    if (!take(lib, handle, where)) lib.error += fmt::format("; point {} at a libnccl.so.2 or unset it", kOverride);
    return lib;
  }
  if (const std::string loaded = already_loaded_nccl(); !loaded.empty()) {
    if (void* handle = ::dlopen(loaded.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); handle != nullptr) {
      lib.path = loaded;
      lib.origin = "already loaded";
      take(lib, handle, fmt::format("the NCCL already loaded in this process ({})", loaded));
      return lib;
    }
  }
  void* handle = ::dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    lib.error = fmt::format("no NCCL could be loaded ({}); {}", dl_error(), kWhatToDo);
    return lib;
  }
  lib.path = path_of(handle, kSoname);
  lib.origin = "loader path";
  if (!take(lib, handle, lib.path)) lib.error += fmt::format("; {}", kWhatToDo);
  return lib;
}

#else

NcclLibrary load() {
  NcclLibrary lib;
  lib.error =
      "this libddl was built without NCCL, so it cannot run collectives on CUDA buffers; rebuild it where nccl.h is found "
      "(DDL_WITH_NCCL=ON, NCCL_INCLUDE_DIR)";
  return lib;
}

#endif

}  // namespace

const NcclLibrary& nccl_library() {
  static const NcclLibrary library = load();
  return library;
}

#if DDL_WITH_NCCL
const NcclLibrary::Api& nccl_api() {
  const NcclLibrary& lib = nccl_library();
  if (!lib.loaded) throw Error(lib.error);
  return lib.api;
}
#endif

}  // namespace ddl::runtime
