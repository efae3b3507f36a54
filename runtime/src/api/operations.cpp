// The C API's collective operations: their argument checks, the one path by which every op reaches
// an engine (submit), and the handles that wait for them. The older forms (blocking, _async,
// _flags_async, _cuda_async) are calls of these; see short_forms.cpp.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ddl/ddl.h"
#include "runtime/src/api/api_state.hpp"
#include "runtime/src/core/dtype.hpp"
#include "runtime/src/engine/engine.hpp"

struct ddl_handle_s {
  std::shared_ptr<ddl::runtime::OpState> state;
  std::weak_ptr<ddl::runtime::Engine> engine;  // the op's, which a wait runs rounds on; gone after finalize
};

namespace ddl::api {

ddl_status run_to_completion(Engine& engine, const char* name, OpSpec spec, const void* send, void* recv, void* stream) {
  std::string message;
  const ddl_status status = engine.run(name ? name : "", std::move(spec), send, recv, message, stream);
  return status == DDL_SUCCESS ? status : fail(status, message);
}

namespace {

// Whether `count` elements of `dtype`, `times` over, are more bytes than a size_t counts: such an op
// would wrap around, touch a few bytes and report success.
bool too_many_bytes(uint64_t count, ddl_dtype dtype, uint64_t times = 1) {
  const uint64_t element = ddl::runtime::dtype_size(dtype);
  return element != 0 && times != 0 && count > std::numeric_limits<size_t>::max() / element / times;
}

// The sum of `counts`, or the largest uint64_t where it wraps around (which the size checks refuse).
uint64_t sum_of(const size_t* counts, int n) {
  uint64_t total = 0;
  for (int i = 0; i < n; ++i)
    if (__builtin_add_overflow(total, counts[i], &total)) return std::numeric_limits<uint64_t>::max();
  return total;
}

ddl_status refuse_byte_count(uint64_t count, ddl_dtype dtype) {
  return fail(DDL_ERROR_INVALID_ARGUMENT,
              fmt::format("{} {} elements are more bytes than memory can hold (a count or a sum of counts that wrapped around?)", count,
                          ddl::runtime::dtype_name(dtype)));
}

// An allgather's output holds every rank's count: refused where its bytes do not fit in a size_t.
ddl_status check_gathered_size(const OpSpec& spec, int ranks) {
  if (spec.kind != OpKind::Allgather || !too_many_bytes(spec.count, spec.dtype, static_cast<uint64_t>(ranks))) return DDL_SUCCESS;
  return refuse_byte_count(spec.count * static_cast<uint64_t>(ranks), spec.dtype);
}

ddl_status check_common(const void* recv, size_t count, ddl_dtype dtype) {
  if (!ddl::runtime::valid_dtype(dtype)) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown dtype {}", static_cast<int>(dtype)));
  if (too_many_bytes(count, dtype)) return refuse_byte_count(count, dtype);
  if (recv == nullptr && count > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the buffer is NULL");
  return DDL_SUCCESS;
}

// check_common, plus the send buffer of an op that reads one.
ddl_status check_buffers(const void* send, const void* recv, size_t count, ddl_dtype dtype) {
  if (auto s = check_common(recv, count, dtype); s != DDL_SUCCESS) return s;
  if (send == nullptr && count > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the send buffer is NULL");
  return DDL_SUCCESS;
}

// A reduction's op and dtype: the moved-only types have no arithmetic here.
ddl_status check_reduction(ddl_reduce_op op, ddl_dtype dtype) {
  if (!ddl::runtime::valid_dtype(dtype)) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown dtype {}", static_cast<int>(dtype)));
  if (!ddl::runtime::valid_reduce_op(op))
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown reduce op {}", static_cast<int>(op)));
  if (!ddl::runtime::reducible_dtype(dtype))
    return fail(DDL_ERROR_INVALID_ARGUMENT,
                fmt::format("{} is moved only (broadcast, allgather, alltoall), not reduced", ddl::runtime::dtype_name(dtype)));
  return DDL_SUCCESS;
}

// The handle of an op just submitted to the engine. An op the engine refused at once (its name
// already in flight, after ddl_finalize, a broken world) fails here instead, with no handle, as
// Horovod refuses it at enqueue rather than at the wait. An op that was taken but has already run
// and failed by now (a mismatch found in a quick round) still gets its handle: only the wait
// reports how an op ran, whatever the timing.
ddl_status handle_of(Engine& engine, std::shared_ptr<ddl::runtime::OpState> state, ddl_handle* handle) {
  if (state->refused()) {
    std::string message;
    const ddl_status status = state->wait(message);  // before `message` is read: fail()'s arguments have no order
    return fail(status, message);
  }
  *handle = new ddl_handle_s{std::move(state), engine.weak_from_this()};
  return DDL_SUCCESS;
}

// An op's status once it is done. The waiting thread runs the engine's rounds itself where it can
// (Engine::run_rounds_until_done), holding the engine only meanwhile: were it held while sleeping,
// a ddl_finalize on another thread would leave the engine to be destroyed on this one. After
// finalize the engine is gone and the op long done.
ddl_status wait_for(ddl_handle_s& handle, std::string& message) {
  return guarded("ddl_wait", [&] {
    if (!handle.state->done())
      if (std::shared_ptr<Engine> engine = handle.engine.lock()) engine->run_rounds_until_done(*handle.state);
    return handle.state->wait(message);
  });
}

const ddl_op_options kDefaultOptions = DDL_OP_OPTIONS_INIT;

ddl_status refuse_blocking(const char* function) {
  return fail(DDL_ERROR_INVALID_ARGUMENT,
              fmt::format("{}: DDL_BLOCKING applies to ddl_allreduce_ex, ddl_broadcast_ex, ddl_allgather_ex, "
                          "ddl_allgatherv_ex, ddl_alltoall_ex and ddl_reducescatter_ex; wait on this op's handle instead",
                          function));
}

// The options, checked: known flags, a shape when ndim > 0, scaling only on host buffers.
ddl_status read_options(const ddl_op_options* given, ddl_op_options& o, std::vector<int64_t>& shape) {
  o = given ? *given : kDefaultOptions;
  if (o.flags & ~(DDL_COMPRESS_FP16 | DDL_CUDA_BUFFERS | DDL_BLOCKING | DDL_ORDERED))
    return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown op flags {:#x}", o.flags));
  if (o.ndim < 0 || (o.ndim > 0 && o.shape == nullptr)) return fail(DDL_ERROR_INVALID_ARGUMENT, "options: ndim > 0 needs a shape");
  shape.assign(o.shape, o.shape + o.ndim);
  if ((o.flags & DDL_CUDA_BUFFERS) && (o.prescale != 1.0 || o.postscale != 1.0))
    return fail(DDL_ERROR_UNSUPPORTED, "prescale and postscale apply to host buffers; scale CUDA buffers on their stream");
  return DDL_SUCCESS;
}

constexpr size_t kCallSiteBytes = 256;  // of ddl_op_options.call_site: what ranks compare and announce

// What the options add to the spec every rank agrees on: the group the op belongs to, and whether
// its name is its place in an order (unnamed ops are, whatever the flag says).
OpSpec agreed(OpSpec spec, const ddl_op_options& o) {
  spec.group_size = o.group_size;
  spec.ordered = (o.flags & DDL_ORDERED) != 0;
  if (o.call_site != nullptr) spec.call_site.assign(o.call_site, ::strnlen(o.call_site, kCallSiteBytes));
  return spec;
}

// An op on its way to an engine: what every rank agrees on (the spec), and this rank's own part.
struct Submission {
  const char* name = nullptr;  // NULL: the next unnamed op
  OpSpec spec;
  const void* send = nullptr;
  void* recv = nullptr;
  void* stream = nullptr;                        // a CUDA op's stream
  std::vector<size_t> send_counts, recv_counts;  // counts only this rank knows (alltoallv, the _any ops)
};

// The one way an op reaches an engine. With DDL_BLOCKING it runs on the calling thread and is done
// when this returns (*handle, if given, becomes NULL); otherwise it is queued and *handle is its
// handle, or it is refused at once and gets none (handle_of).
ddl_status submit(Target& t, Submission op, unsigned flags, ddl_handle* handle) {
  if (auto s = check_gathered_size(op.spec, t.size); s != DDL_SUCCESS) return s;
  std::string name = op.name != nullptr ? op.name : "";
  if (flags & DDL_BLOCKING) {
    if (!op.send_counts.empty() || !op.recv_counts.empty()) return fail(DDL_ERROR_INTERNAL, "a blocking op with counts of its own");
    if (handle != nullptr) *handle = nullptr;
    t.handed_over = true;
    return run_to_completion(*t.engine, name.c_str(), std::move(op.spec), op.send, op.recv, op.stream);
  }
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  t.handed_over = true;
  return handle_of(*t.engine,
                   t.engine->submit_with_counts(std::move(name), std::move(op.spec), op.send, op.recv, std::move(op.send_counts),
                                                std::move(op.recv_counts), op.stream),
                   handle);
}

// An op this rank refused before its engine saw it (an argument only this rank may have got wrong: a
// dtype, a NULL buffer, a root out of range) still takes its place, failing there with the refusal's
// reason, as ddl_fail_ex does: the other ranks' op of that number fails with it instead of waiting for
// DDL_TIMEOUT, and the numbers stay in step, where this rank's next unnamed op would otherwise pair
// with the other ranks' refused one and exchange the wrong data. Nobody waits for it: the engine
// completes it, failed, with the other ranks' op.
void take_place_of_refused(Target& t, const char* name, const ddl_op_options& o, const std::string& reason) {
  OpSpec spec = agreed({OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, o);
  spec.failure = reason.empty() ? "refused by libddl" : reason;
  t.engine->submit(name != nullptr ? name : "", std::move(spec), nullptr, nullptr, nullptr);
}

// Whether an op refused at submit takes its place: an unnamed or ordered one, whose number the other
// ranks' next op would otherwise take. A named op does not: the name stays free for the caller to
// submit again at once (the peers' op of that name waits for it, or for DDL_TIMEOUT).
bool takes_place_when_refused(const char* name, const ddl_op_options& o) { return name == nullptr || (o.flags & DDL_ORDERED) != 0; }

// Reads and checks the options, then runs `body` with them and the op's target process set; an op
// `body` refuses takes its place all the same where it is numbered (take_place_of_refused).
template <typename Body>
ddl_status with_target(const char* name, const ddl_op_options* options, Body body) {
  ddl_op_options o;
  std::vector<int64_t> shape;
  if (auto s = read_options(options, o, shape); s != DDL_SUCCESS) return s;
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, o.process_set, t); s != DDL_SUCCESS) return s;
    // An exception (out of memory) is a refusal too: it takes the op's place like any other.
    const ddl_status status = guarded("libddl", [&] { return body(t, o, std::move(shape)); });
    if (status != DDL_SUCCESS && !t.handed_over && takes_place_when_refused(name, o)) take_place_of_refused(t, name, o, last_error());
    return status;
  });
}

}  // namespace

ddl_status refuse_in_place(const char* name, const ddl_op_options* options, ddl_status status, const std::string& message) {
  return with_target(name, options, [&](Target&, const ddl_op_options&, const std::vector<int64_t>&) { return fail(status, message); });
}

}  // namespace ddl::api

using namespace ddl::api;  // NOLINT(google-build-using-namespace)

extern "C" {

ddl_status ddl_allreduce_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                            const ddl_op_options* options, ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
    if (auto s = check_reduction(op, dtype); s != DDL_SUCCESS) return s;
    const bool compress = (o.flags & DDL_COMPRESS_FP16) != 0;
    const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;
    if (compress && dtype != DDL_FLOAT32)
      return fail(DDL_ERROR_INVALID_ARGUMENT,
                  fmt::format("DDL_COMPRESS_FP16 applies to float32 allreduces, not {}", ddl::runtime::dtype_name(dtype)));
    if (cuda && dtype == DDL_INT16) return fail(DDL_ERROR_UNSUPPORTED, "NCCL cannot reduce int16 CUDA buffers");
    OpSpec spec{OpKind::Allreduce, dtype, op, 0, count, {}, cuda, compress, std::move(shape), o.prescale, o.postscale};
    return submit(t, {name, agreed(std::move(spec), o), send, recv, o.stream}, o.flags, handle);
  });
}

ddl_status ddl_broadcast_ex(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, const ddl_op_options* options,
                            ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (auto s = check_common(buffer, count, dtype); s != DDL_SUCCESS) return s;
    if (root < 0 || root >= t.size)
      return fail(DDL_ERROR_INVALID_ARGUMENT,
                  fmt::format("broadcast root {} is not a rank of a {} of {}", root, o.process_set == nullptr ? "world" : "set", t.size));
    OpSpec spec{OpKind::Broadcast, dtype, DDL_SUM, root, count, {}, (o.flags & DDL_CUDA_BUFFERS) != 0, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), buffer, buffer, o.stream}, o.flags, handle);
  });
}

ddl_status ddl_allgather_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, const ddl_op_options* options,
                            ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::Allgather, dtype, DDL_SUM, 0, count, {}, (o.flags & DDL_CUDA_BUFFERS) != 0, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), send, recv, o.stream}, o.flags, handle);
  });
}

ddl_status ddl_allgatherv_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                             const ddl_op_options* options, ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (recv_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
    std::vector<uint64_t> counts(recv_counts, recv_counts + t.size);
    const uint64_t total = sum_of(recv_counts, t.size);
    // The send buffer holds this rank's count only: none may come as NULL (refusing it would leave
    // the other ranks waiting for this one).
    if (auto s = check_common(recv, total, dtype); s != DDL_SUCCESS) return s;
    if (counts[static_cast<size_t>(t.rank)] > 0 && send == nullptr)
      return fail(DDL_ERROR_INVALID_ARGUMENT, "allgatherv: the send buffer is NULL");
    if (o.flags & DDL_CUDA_BUFFERS) {  // NCCL gathers equal blocks only
      if (std::any_of(counts.begin(), counts.end(), [&](uint64_t c) { return c != counts[0]; }))
        return fail(DDL_ERROR_UNSUPPORTED, "allgatherv of CUDA buffers needs equal counts on every rank");
      OpSpec spec{OpKind::Allgather, dtype, DDL_SUM, 0, counts[0], {}, true, false, std::move(shape)};
      return submit(t, {name, agreed(std::move(spec), o), send, recv, o.stream}, o.flags, handle);
    }
    OpSpec spec{OpKind::Allgatherv, dtype, DDL_SUM, 0, total, counts, false, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), send, recv}, o.flags, handle);
  });
}

ddl_status ddl_alltoall_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, const ddl_op_options* options,
                           ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (auto s = check_buffers(send, recv, count, dtype); s != DDL_SUCCESS) return s;
    if (o.flags & DDL_CUDA_BUFFERS)
      return fail(DDL_ERROR_UNSUPPORTED, "ddl_alltoall_ex takes host buffers; give CUDA buffers to ddl_alltoallv_ex, with equal counts");
    if (too_many_bytes(count, dtype, static_cast<uint64_t>(t.size))) return refuse_byte_count(count * static_cast<uint64_t>(t.size), dtype);
    OpSpec spec{OpKind::Alltoall, dtype, DDL_SUM, 0, count, {}, false, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), send, recv}, o.flags, handle);
  });
}

ddl_status ddl_alltoallv_ex(const char* name, const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                            ddl_dtype dtype, const ddl_op_options* options, ddl_handle* handle) {
  if (options != nullptr && (options->flags & DDL_BLOCKING)) return refuse_blocking("ddl_alltoallv_ex");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (send_counts == nullptr || recv_counts == nullptr)
      return fail(DDL_ERROR_INVALID_ARGUMENT, "alltoallv: send_counts or recv_counts is NULL");
    const auto n = static_cast<size_t>(t.size);
    if (auto s = check_common(recv, sum_of(recv_counts, t.size), dtype); s != DDL_SUCCESS) return s;
    if (sum_of(send_counts, t.size) > 0 && send == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "alltoallv: the send buffer is NULL");
    const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;  // NCCL sends and receives, on o.stream
    OpSpec spec{OpKind::Alltoallv, dtype, DDL_SUM, 0, 0, {}, cuda, false, std::move(shape)};
    return submit(t,
                  {name, agreed(std::move(spec), o), send, recv, cuda ? o.stream : nullptr,
                   std::vector<size_t>(send_counts, send_counts + n), std::vector<size_t>(recv_counts, recv_counts + n)},
                  o.flags, handle);
  });
}

ddl_status ddl_allgather_any_ex(const char* name, const void* send, size_t send_count, ddl_dtype dtype, const ddl_op_options* options,
                                ddl_handle* handle) {
  if (options != nullptr && (options->flags & DDL_BLOCKING)) return refuse_blocking("ddl_allgather_any_ex");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (o.flags & DDL_CUDA_BUFFERS) return fail(DDL_ERROR_UNSUPPORTED, "ddl_allgather_any_ex takes host buffers");
    if (auto s = check_common(send, send_count, dtype); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::AllgatherAny, dtype, DDL_SUM, 0, 0, {}, false, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), send, nullptr, nullptr, {send_count}, {}}, o.flags, handle);
  });
}

ddl_status ddl_alltoall_any_ex(const char* name, const void* send, const size_t* send_counts, ddl_dtype dtype,
                               const ddl_op_options* options, ddl_handle* handle) {
  if (options != nullptr && (options->flags & DDL_BLOCKING)) return refuse_blocking("ddl_alltoall_any_ex");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (o.flags & DDL_CUDA_BUFFERS) return fail(DDL_ERROR_UNSUPPORTED, "ddl_alltoall_any_ex takes host buffers");
    if (send_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_alltoall_any_ex: send_counts is NULL");
    if (auto s = check_common(send, sum_of(send_counts, t.size), dtype); s != DDL_SUCCESS) return s;
    OpSpec spec{OpKind::AlltoallAny, dtype, DDL_SUM, 0, 0, {}, false, false, std::move(shape)};
    return submit(t, {name, agreed(std::move(spec), o), send, nullptr, nullptr, std::vector<size_t>(send_counts, send_counts + t.size), {}},
                  o.flags, handle);
  });
}

ddl_status ddl_gathered(ddl_handle handle, size_t* counts, const void** data) {
  if (handle == nullptr || counts == nullptr || data == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_gathered: NULL argument");
  std::string message;
  ddl_status status = wait_for(*handle, message);
  if (status != DDL_SUCCESS) return fail(status, message);
  const auto& c = handle->state->gathered_counts();
  if (c.empty()) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_gathered: the handle is not a ddl_allgather_any_ex or ddl_alltoall_any_ex");
  std::copy(c.begin(), c.end(), counts);
  *data = handle->state->gathered().data();
  return DDL_SUCCESS;
}

ddl_status ddl_reducescatter_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                                ddl_reduce_op op, const ddl_op_options* options, ddl_handle* handle) {
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, std::vector<int64_t> shape) {
    if (recv_counts == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "reducescatter: recv_counts is NULL");
    if (auto s = check_reduction(op, dtype); s != DDL_SUCCESS) return s;
    const bool cuda = (o.flags & DDL_CUDA_BUFFERS) != 0;
    if (cuda && dtype == DDL_INT16) return fail(DDL_ERROR_UNSUPPORTED, "NCCL cannot reduce int16 CUDA buffers");
    std::vector<uint64_t> counts(recv_counts, recv_counts + t.size);
    const uint64_t total = sum_of(recv_counts, t.size);
    // The output holds this rank's share only: none (fewer rows than ranks) may come as NULL, as
    // an empty tensor's storage does; refusing it here would leave the other ranks waiting for this one.
    if (auto s = check_common(recv, counts[static_cast<size_t>(t.rank)], dtype); s != DDL_SUCCESS) return s;
    if (too_many_bytes(total, dtype)) return refuse_byte_count(total, dtype);
    if (send == nullptr && total > 0) return fail(DDL_ERROR_INVALID_ARGUMENT, "the send buffer is NULL");
    OpSpec spec{OpKind::Reducescatter, dtype, op, 0, total, counts, cuda, false, std::move(shape), o.prescale, o.postscale};
    return submit(t, {name, agreed(std::move(spec), o), send, recv, cuda ? o.stream : nullptr}, o.flags, handle);
  });
}

ddl_status ddl_join(ddl_process_set set, int* last_rank) {
  if (last_rank == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_join: NULL output");
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, set, t); s != DDL_SUCCESS) return s;
    ddl_handle handle = nullptr;
    if (auto s = submit(t, {"ddl.join", {OpKind::Join, DDL_FLOAT32, DDL_SUM, 0, 0, {}}}, 0, &handle); s != DDL_SUCCESS) return s;
    const std::unique_ptr<ddl_handle_s> owned(handle);
    // Waited for on this thread without running rounds: the engine thread runs them meanwhile,
    // taking part in the other ranks' ops for this one.
    std::string message;
    if (ddl_status s = owned->state->wait(message); s != DDL_SUCCESS) return fail(s, message);
    *last_rank = static_cast<int>(owned->state->gathered_counts().at(0));
    return DDL_SUCCESS;
  });
}

ddl_status ddl_fail_ex(const char* name, const char* reason, const ddl_op_options* options, ddl_handle* handle) {
  if (reason == nullptr || *reason == '\0') return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_fail_ex: the reason is NULL or empty");
  if (options != nullptr && (options->flags & DDL_BLOCKING)) return refuse_blocking("ddl_fail_ex");
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "handle is NULL");
  return with_target(name, options, [&](Target& t, const ddl_op_options& o, const std::vector<int64_t>&) {
    // A barrier's spec carries the reason: it is never run (the negotiator fails it on every rank).
    OpSpec spec = agreed({OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}, o);
    spec.failure = reason;
    return submit(t, {name, std::move(spec)}, o.flags, handle);
  });
}

ddl_status ddl_barrier_ex(ddl_process_set set, ddl_handle* handle) {
  return with_runtime([&](Runtime& rt) {
    Target t;
    if (auto s = resolve(rt, set, t); s != DDL_SUCCESS) return s;
    // A NULL handle: the blocking barrier of the set.
    return submit(t, {nullptr, {OpKind::Barrier, DDL_FLOAT32, DDL_SUM, 0, 0, {}}}, handle == nullptr ? DDL_BLOCKING : 0u, handle);
  });
}

ddl_status ddl_wait(ddl_handle handle) {
  if (handle == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_wait: NULL handle");
  std::unique_ptr<ddl_handle_s> owned(handle);
  std::string message;
  ddl_status status = wait_for(*owned, message);
  return status == DDL_SUCCESS ? status : fail(status, message);
}

ddl_status ddl_test(ddl_handle handle, int* done) {
  if (handle == nullptr || done == nullptr) return fail(DDL_ERROR_INVALID_ARGUMENT, "ddl_test: NULL handle or output");
  *done = handle->state->done() ? 1 : 0;
  return DDL_SUCCESS;
}

}  // extern "C"
