// The C API's older forms of the collectives (blocking, _async, _flags_async, _cuda_async): each is a
// call of its _ex twin with the options it stands for, so every op takes one path (operations.cpp).
#include <fmt/format.h>

#include "ddl/ddl.h"
#include "runtime/src/api/api_state.hpp"

namespace {

using ddl::api::fail;
using ddl::api::refuse_in_place;

ddl_op_options options_with(unsigned flags, void* stream = nullptr) {
  ddl_op_options o = DDL_OP_OPTIONS_INIT;
  o.flags = flags;
  o.stream = stream;
  return o;
}

const ddl_op_options kBlocking = options_with(DDL_BLOCKING);

// ddl_allgatherv's send_count must be this rank's entry of recv_counts, which the _ex form reads alone.
ddl_status allgatherv_with_send_count(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                                      ddl_dtype dtype, const ddl_op_options* options, ddl_handle* handle) {
  int rank = 0;
  if (auto s = ddl_rank(&rank); s != DDL_SUCCESS) return s;
  if (recv_counts == nullptr) return refuse_in_place(name, options, DDL_ERROR_INVALID_ARGUMENT, "allgatherv: recv_counts is NULL");
  if (recv_counts[rank] != send_count)
    return refuse_in_place(name, options, DDL_ERROR_INVALID_ARGUMENT,
                           fmt::format("allgatherv: send_count {} differs from recv_counts[{}] = {}", send_count, rank, recv_counts[rank]));
  return ddl_allgatherv_ex(name, send, recv, recv_counts, dtype, options, handle);
}

}  // namespace

extern "C" {

ddl_status ddl_allreduce(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op) {
  return ddl_allreduce_ex(name, send, recv, count, dtype, op, &kBlocking, nullptr);
}
ddl_status ddl_broadcast(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root) {
  return ddl_broadcast_ex(name, buffer, count, dtype, root, &kBlocking, nullptr);
}
ddl_status ddl_allgather(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  return ddl_allgather_ex(name, send, recv, count, dtype, &kBlocking, nullptr);
}
ddl_status ddl_allgatherv(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts, ddl_dtype dtype) {
  return allgatherv_with_send_count(name, send, send_count, recv, recv_counts, dtype, &kBlocking, nullptr);
}
ddl_status ddl_alltoall(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype) {
  return ddl_alltoall_ex(name, send, recv, count, dtype, &kBlocking, nullptr);
}
ddl_status ddl_barrier(void) { return ddl_barrier_ex(nullptr, nullptr); }

ddl_status ddl_allreduce_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                               ddl_handle* handle) {
  return ddl_allreduce_ex(name, send, recv, count, dtype, op, nullptr, handle);
}
ddl_status ddl_allreduce_flags_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                     unsigned flags, ddl_handle* handle) {
  if (flags & ~DDL_COMPRESS_FP16) return fail(DDL_ERROR_INVALID_ARGUMENT, fmt::format("unknown allreduce flags {:#x}", flags));
  const ddl_op_options options = options_with(flags);
  return ddl_allreduce_ex(name, send, recv, count, dtype, op, &options, handle);
}
ddl_status ddl_broadcast_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, ddl_handle* handle) {
  return ddl_broadcast_ex(name, buffer, count, dtype, root, nullptr, handle);
}
ddl_status ddl_allgather_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle) {
  return ddl_allgather_ex(name, send, recv, count, dtype, nullptr, handle);
}
ddl_status ddl_allgatherv_async(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                                ddl_dtype dtype, ddl_handle* handle) {
  return allgatherv_with_send_count(name, send, send_count, recv, recv_counts, dtype, nullptr, handle);
}
ddl_status ddl_alltoall_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle) {
  return ddl_alltoall_ex(name, send, recv, count, dtype, nullptr, handle);
}

ddl_status ddl_allreduce_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                    void* stream, ddl_handle* handle) {
  const ddl_op_options options = options_with(DDL_CUDA_BUFFERS, stream);
  return ddl_allreduce_ex(name, send, recv, count, dtype, op, &options, handle);
}
ddl_status ddl_broadcast_cuda_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, void* stream,
                                    ddl_handle* handle) {
  const ddl_op_options options = options_with(DDL_CUDA_BUFFERS, stream);
  return ddl_broadcast_ex(name, buffer, count, dtype, root, &options, handle);
}
ddl_status ddl_allgather_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream,
                                    ddl_handle* handle) {
  const ddl_op_options options = options_with(DDL_CUDA_BUFFERS, stream);
  return ddl_allgather_ex(name, send, recv, count, dtype, &options, handle);
}

}  // extern "C"
