/* libddl: collective operations for data-parallel training, callable from C and C++.
 *
 * A program started by `ddl run` calls ddl_init(), which joins the run's other workers through the
 * rendezvous store that `ddl run` hosts (DDL_STORE_ADDR / DDL_STORE_TOKEN). Without those
 * variables the world is this single process, so a notebook or a unit test needs no launcher.
 * DDL_BOOTSTRAP=store|single forces one of them.
 *
 * Every collective has a name. Ranks may submit their named operations in different orders: a
 * background thread agrees with the other ranks on which names every rank has submitted, and runs
 * those (small ones of the same kind fused into one buffer). An operation submitted with a
 * different shape, type, reduction or root on different ranks fails on every rank with a message
 * naming the operation and the ranks. A NULL name means "the next unnamed operation": ranks must
 * then submit their unnamed operations in the same order.
 *
 * Buffers are host memory, except for the *_cuda_async functions. Calls are thread-safe. Every function returns a ddl_status; on failure
 * ddl_last_error() describes the last failure of the calling thread.
 *
 * Environment: DDL_TIMEOUT (seconds, default 300) bounds every wait on a peer; DDL_CYCLE_TIME_MS
 * (default 1) is the negotiation period; DDL_FUSION_THRESHOLD (bytes, default 64 MiB, 0 turns
 * fusion off) caps a fusion buffer; DDL_TIMELINE=file.json writes a Chrome trace of every op.
 */
#ifndef DDL_DDL_H
#define DDL_DDL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DDL_API __attribute__((visibility("default")))
#else
#define DDL_API
#endif

typedef enum {
  DDL_SUCCESS = 0,
  DDL_ERROR_INVALID_ARGUMENT = 1, /* a bad pointer, count, type, root or duplicate name */
  DDL_ERROR_NOT_INITIALIZED = 2,  /* ddl_init() was not called, or ddl_finalize() was */
  DDL_ERROR_MISMATCH = 3,         /* ranks submitted the same name with different parameters */
  DDL_ERROR_TIMEOUT = 4,          /* a peer did not answer within DDL_TIMEOUT */
  DDL_ERROR_PEER_FAILED = 5,      /* a peer died or the connection to it broke */
  DDL_ERROR_BOOTSTRAP = 6,        /* joining the other workers failed */
  DDL_ERROR_INTERNAL = 7,
  DDL_ERROR_UNSUPPORTED = 8       /* e.g. a CUDA buffer without NCCL or without a visible GPU */
} ddl_status;

typedef enum {
  DDL_FLOAT16 = 0,
  DDL_BFLOAT16 = 1,
  DDL_FLOAT32 = 2,
  DDL_FLOAT64 = 3,
  DDL_INT32 = 4,
  DDL_INT64 = 5
} ddl_dtype;

typedef enum {
  DDL_SUM = 0,
  DDL_AVERAGE = 1, /* the sum divided by the world size (integers: truncated toward zero) */
  DDL_MIN = 2,
  DDL_MAX = 3,
  DDL_PRODUCT = 4
} ddl_reduce_op;

/* An operation in flight; ddl_wait() releases it. */
typedef struct ddl_handle_s* ddl_handle;

/* Joins the world (see above). Calling it again while initialized does nothing.
 * If SIGPIPE has its default action, it is set to ignored, so that a peer that dies turns into an
 * error on the survivors rather than killing them; a handler the program installed is kept. */
DDL_API ddl_status ddl_init(void);
/* Waits for the other ranks to finalize too, then releases everything. */
DDL_API ddl_status ddl_finalize(void);
DDL_API int ddl_is_initialized(void);

DDL_API ddl_status ddl_rank(int* rank);
DDL_API ddl_status ddl_size(int* size);
DDL_API ddl_status ddl_local_rank(int* local_rank);
DDL_API ddl_status ddl_local_size(int* local_size);
DDL_API ddl_status ddl_node_rank(int* node_rank);

/* The message of the calling thread's last failure ("" if none). Valid until its next ddl call. */
DDL_API const char* ddl_last_error(void);
DDL_API const char* ddl_status_string(ddl_status status);
DDL_API size_t ddl_dtype_size(ddl_dtype dtype);

/* recv[i] = op over ranks of send[i], for i < count. send may equal recv (in place). */
DDL_API ddl_status ddl_allreduce(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                 ddl_reduce_op op);
/* buffer (count elements) on every rank becomes root's. */
DDL_API ddl_status ddl_broadcast(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root);
/* recv (size * count elements) holds every rank's send, in rank order. */
DDL_API ddl_status ddl_allgather(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype);
/* Like allgather, rank r contributing recv_counts[r] elements (its send_count must equal that). */
DDL_API ddl_status ddl_allgatherv(const char* name, const void* send, size_t send_count, void* recv,
                                  const size_t* recv_counts, ddl_dtype dtype);
/* Block j of send (count elements) goes to rank j; block j of recv comes from rank j. */
DDL_API ddl_status ddl_alltoall(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype);
/* Returns when every rank has called it. */
DDL_API ddl_status ddl_barrier(void);

/* Asynchronous forms: start the operation and return a handle at once. The buffers must stay
 * valid and untouched until ddl_wait() returns. */
DDL_API ddl_status ddl_allreduce_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                       ddl_reduce_op op, ddl_handle* handle);
DDL_API ddl_status ddl_broadcast_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root,
                                       ddl_handle* handle);
DDL_API ddl_status ddl_allgather_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                       ddl_handle* handle);
DDL_API ddl_status ddl_allgatherv_async(const char* name, const void* send, size_t send_count, void* recv,
                                        const size_t* recv_counts, ddl_dtype dtype, ddl_handle* handle);
DDL_API ddl_status ddl_alltoall_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                      ddl_handle* handle);

/* CUDA device buffers go through NCCL, enqueued on `stream` (a cudaStream_t; NULL is the default
 * stream) after the work already on it; the handle completes when the result is in recv.
 * Negotiation, names and mismatch errors work as for host buffers (a name used with a host buffer
 * on one rank and a CUDA buffer on another is a mismatch). Without NCCL in this build, or without
 * a visible GPU, they fail with DDL_ERROR_UNSUPPORTED and host operations are unaffected. */
DDL_API ddl_status ddl_allreduce_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                            ddl_reduce_op op, void* stream, ddl_handle* handle);
DDL_API ddl_status ddl_broadcast_cuda_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root,
                                            void* stream, ddl_handle* handle);
DDL_API ddl_status ddl_allgather_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                            void* stream, ddl_handle* handle);

/* Build facts, for `ddl check-build`: the NCCL version compiled in ("" if none), and whether the
 * PMIx bootstrap is. */
DDL_API const char* ddl_nccl_version(void);
DDL_API int ddl_has_pmix(void);

/* Flags of ddl_allreduce_flags_async. DDL_COMPRESS_FP16: a float32 allreduce travels as float16
 * (half the bytes; about 3 significant digits, values beyond +-65504 saturate), like Horovod's
 * Compression.fp16. Every rank must give the same flags for a name. */
#define DDL_COMPRESS_FP16 1u
DDL_API ddl_status ddl_allreduce_flags_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                             ddl_reduce_op op, unsigned flags, ddl_handle* handle);

/* Waits for the operation, releases the handle and returns its status. */
DDL_API ddl_status ddl_wait(ddl_handle handle);
/* *done = 1 when the operation has finished (then ddl_wait returns at once), else 0. */
DDL_API ddl_status ddl_test(ddl_handle handle, int* done);

#ifdef __cplusplus
}
#endif

#endif /* DDL_DDL_H */
