/* libddl: collective operations for data-parallel training, callable from C and C++.
 *
 * A program started by `ddl run` calls ddl_init(), which joins the run's other workers through the
 * rendezvous store that `ddl run` hosts (DDL_STORE_ADDR / DDL_STORE_TOKEN). Started by a PMIx
 * launcher instead (OpenMPI's mpirun, `srun --mpi=pmix`), it joins through PMIx. Without either,
 * the world is this single process, so a notebook or a unit test needs no launcher.
 * DDL_BOOTSTRAP=store|pmix|single forces one of them. A program started some other way (mp.spawn,
 * torchrun) that shares a key-value store with its peers joins them with ddl_init_with_store.
 *
 * Every collective has a name. Ranks may submit their named operations in different orders: a
 * background thread agrees with the other ranks on which names every rank has submitted, and runs
 * those (small ones of the same kind fused into one buffer). An operation submitted with a
 * different shape, type, reduction or root on different ranks fails on every rank with a message
 * naming the operation and the ranks. A NULL name means "the next unnamed operation": ranks must
 * then submit their unnamed operations in the same order.
 *
 * Buffers are host memory, except for the *_cuda_async functions and DDL_CUDA_BUFFERS. Calls are
 * thread-safe. Every function that can fail returns a ddl_status (no C++ exception leaves the
 * library); on failure ddl_last_error() describes the last failure of the calling thread.
 *
 * Environment: DDL_TIMEOUT (seconds, default 300) bounds every wait on a peer; DDL_CYCLE_TIME_MS
 * (default 1) is the negotiation period; DDL_FUSION_THRESHOLD (bytes, default 64 MiB, 0 turns
 * fusion off) caps a fusion buffer; DDL_TIMELINE=file.json writes a Chrome trace of every op.
 */
#ifndef DDL_DDL_H
#define DDL_DDL_H

/* The version of this header; ddl_version() gives the library's ("0.1.0"). */
#define DDL_VERSION_MAJOR 0
#define DDL_VERSION_MINOR 1
#define DDL_VERSION_PATCH 0

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DDL_API __attribute__((visibility("default")))
#else
#define DDL_API
#endif

/* In C++ the enums a caller passes in are int-based, so that any int (a bad value, say, from a
   binding) is a value libddl can check and refuse with DDL_ERROR_INVALID_ARGUMENT rather than
   undefined behaviour. The same size and values as in C. */
#ifdef __cplusplus
#define DDL_ENUM_INT : int
#else
#define DDL_ENUM_INT
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
  DDL_ERROR_UNSUPPORTED = 8 /* e.g. a CUDA buffer without NCCL or without a visible GPU */
} ddl_status;

typedef enum DDL_ENUM_INT {
  DDL_FLOAT16 = 0,
  DDL_BFLOAT16 = 1,
  DDL_FLOAT32 = 2,
  DDL_FLOAT64 = 3,
  DDL_INT32 = 4,
  DDL_INT64 = 5,
  DDL_UINT8 = 6,
  DDL_INT8 = 7,
  DDL_INT16 = 8, /* reduced on host buffers only: NCCL has no 16-bit integer type */
  /* Moved only (broadcast, allgather, alltoall, their _any and v forms); reductions refuse them. Ranks
   * must agree on them as on any dtype, so a bool on one rank never pairs with a uint8 on another. */
  DDL_BOOL = 9,
  DDL_UINT16 = 10,
  DDL_UINT32 = 11,
  DDL_UINT64 = 12
} ddl_dtype;

typedef enum DDL_ENUM_INT {
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

/* A key-value store the program already shares with its peers (torch.distributed's store under
   mp.spawn or torchrun, say), through which ddl_init_with_store finds them. libddl calls it from
   the thread that initializes and from the threads that make process sets, never after
   ddl_finalize; `context` must stay valid until then. Both return 0 on success.
   set: stores `size` bytes at `value` under `key`.
   get: waits at most `timeout_ms` for `key`, then hands its value to deliver(sink, value, size)
   before returning; nonzero if the key did not come in time or the store failed. */
typedef struct ddl_store {
  void* context;
  int (*set)(void* context, const char* key, const void* value, size_t size);
  int (*get)(void* context, const char* key, long long timeout_ms, void (*deliver)(void* sink, const void* value, size_t size), void* sink);
} ddl_store;

/* Joins the world of `size` ranks as `rank` through `store` (copied; its context is not), where no
   launcher gives libddl the world: every rank calls it with the same size and its own rank. Ranks
   on one host (by host name) talk through shared memory, hosts through Gloo, at this host's address
   on the route to $MASTER_ADDR when that is set (DDL_GLOO_ADDR overrides it). Already initialized
   as that rank of that size: DDL_SUCCESS; as another: DDL_ERROR_INVALID_ARGUMENT. Keys are written
   under "ddl/": the store may be shared with other users. */
DDL_API ddl_status ddl_init_with_store(int rank, int size, const ddl_store* store);

/* How this process found its world: "ddl run" (its store), "pmix", "program store"
   (ddl_init_with_store) or "single"; "" before ddl_init. Valid until ddl_finalize. */
DDL_API const char* ddl_world_source(void);
/* Waits for the other ranks to finalize too, then releases everything. The wait is bounded by
 * DDL_TIMEOUT (a process set's by its own timeout): a rank still not finalized then is left behind
 * (it finds this one gone) and this call returns DDL_ERROR_TIMEOUT naming it, everything released
 * all the same. DDL_ERROR_PEER_FAILED if a peer died meanwhile. */
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
/* The library's version, "MAJOR.MINOR.PATCH": compare with DDL_VERSION_* to detect a mismatch. */
DDL_API const char* ddl_version(void);
DDL_API size_t ddl_dtype_size(ddl_dtype dtype);

/* The blocking forms run the op on the calling thread (no hand-over to libddl's own thread). In a
 * steady state, where every rank runs the same blocking op with nothing else in flight, a host
 * allreduce, broadcast or barrier that is unnamed or whose name ran before runs without a
 * negotiation round of its own; on shared memory a small one then costs one barrier in all. */

/* recv[i] = op over ranks of send[i], for i < count. send may equal recv (in place), not overlap it. */
DDL_API ddl_status ddl_allreduce(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op);
/* buffer (count elements) on every rank becomes root's. */
DDL_API ddl_status ddl_broadcast(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root);
/* recv (size * count elements) holds every rank's send, in rank order. */
DDL_API ddl_status ddl_allgather(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype);
/* Like allgather, rank r contributing recv_counts[r] elements (its send_count must equal that). */
DDL_API ddl_status ddl_allgatherv(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                                  ddl_dtype dtype);
/* Block j of send (count elements) goes to rank j; block j of recv comes from rank j. */
DDL_API ddl_status ddl_alltoall(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype);
/* Returns when every rank has called it. */
DDL_API ddl_status ddl_barrier(void);

/* Asynchronous forms: start the operation and return a handle at once. The buffers must stay
 * valid and untouched until ddl_wait() returns, and ops in flight together must not share or
 * overlap buffers (but an op's send may equal its recv): fused allreduces are reduced straight
 * from and into them. An op refused at once fails here and gets no handle: its name is that of an
 * op still in flight on this rank, ddl_finalize() was called, or the world broke. How a taken op
 * ran (a mismatch between ranks, a timeout) is reported by ddl_wait() only, however soon it ended. */
DDL_API ddl_status ddl_allreduce_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                       ddl_handle* handle);
DDL_API ddl_status ddl_broadcast_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, ddl_handle* handle);
DDL_API ddl_status ddl_allgather_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle);
DDL_API ddl_status ddl_allgatherv_async(const char* name, const void* send, size_t send_count, void* recv, const size_t* recv_counts,
                                        ddl_dtype dtype, ddl_handle* handle);
DDL_API ddl_status ddl_alltoall_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_handle* handle);

/* CUDA device buffers go through NCCL, enqueued on `stream` (a cudaStream_t; NULL is the default
 * stream) after the work already on it; the handle completes when the result is in recv.
 * Negotiation, names and mismatch errors work as for host buffers (a name used with a host buffer
 * on one rank and a CUDA buffer on another is a mismatch). Where ranks share a GPU, NCCL does not
 * load on some rank, or DDL_CUDA_VIA_HOST=1, every rank's CUDA ops go through host memory instead
 * (copied after the work already on `stream`, results copied back before the handle completes).
 * Without a visible GPU, or with a DDL_NCCL_LIBRARY that does not load, they fail with
 * DDL_ERROR_UNSUPPORTED and host operations are unaffected. Ops in flight together must not share
 * buffers. */
DDL_API ddl_status ddl_allreduce_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                            void* stream, ddl_handle* handle);
DDL_API ddl_status ddl_broadcast_cuda_async(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, void* stream,
                                            ddl_handle* handle);
DDL_API ddl_status ddl_allgather_cuda_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, void* stream,
                                            ddl_handle* handle);

/* The NCCL that CUDA buffers go through. libddl does not link NCCL: it loads it at run time, once,
 * on the first CUDA operation or the first call of one of these four, taking the first of
 *   1. the file DDL_NCCL_LIBRARY names (when set, it must load: there is no fallback),
 *   2. an NCCL already loaded in the process (torch's, from pip's nvidia-nccl-cu* wheel), so that
 *      a process holds one NCCL,
 *   3. libnccl.so.2 from the loader's search path (LD_LIBRARY_PATH, e.g. after `module load nccl`;
 *      ld.so.cache).
 * ddl_nccl_version(): its version ("2.28.9"); "" when none loads or libddl was built without NCCL.
 * ddl_nccl_path(): the file it was loaded from; "" when none.
 * ddl_nccl_origin(): "DDL_NCCL_LIBRARY", "already loaded" or "loader path"; "" when none.
 * ddl_nccl_error(): "" when one loaded; else why not and what to set or load (CUDA operations then
 * fail with DDL_ERROR_UNSUPPORTED and this message; host operations are unaffected).
 * The strings live as long as the process. ddl_has_pmix(): whether the PMIx bootstrap is built in. */
DDL_API const char* ddl_nccl_version(void);
DDL_API const char* ddl_nccl_path(void);
DDL_API const char* ddl_nccl_origin(void);
DDL_API const char* ddl_nccl_error(void);
DDL_API int ddl_has_pmix(void);

/* Flags of ddl_allreduce_flags_async. DDL_COMPRESS_FP16: a float32 allreduce travels as float16
 * (half the bytes; about 3 significant digits; values that round beyond +-65504 become +-inf, as a
 * cast to float16 makes them), like Horovod's Compression.fp16. Every rank must give the same flags
 * for a name. */
#define DDL_COMPRESS_FP16 1u
DDL_API ddl_status ddl_allreduce_flags_async(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                             ddl_reduce_op op, unsigned flags, ddl_handle* handle);

/* ---- Process sets, scaling, shapes: what Horovod-style frameworks (ddl.torch) need ----
 *
 * A process set is a subgroup of the world's ranks with collectives of its own; NULL stands for
 * the whole world wherever a ddl_process_set is taken. */
typedef struct ddl_process_set_s* ddl_process_set;

/* Collective over the whole world: every rank calls it, in the same order, with the same ranks
 * (distinct world ranks, any order; they are kept sorted). Every rank gets a handle; on a rank
 * that is not a member, ddl_process_set_rank() gives -1 and operations on the set fail with
 * DDL_ERROR_INVALID_ARGUMENT. Ranks that disagree on the list fail with DDL_ERROR_MISMATCH. */
DDL_API ddl_status ddl_process_set_create(const int* ranks, int count, ddl_process_set* set);
/* Collective over the set's members only, for frameworks that make subgroups on their members
 * alone (torch.distributed's new_group): every rank in `ranks` calls it with the same ranks and the
 * same `key` (letters, digits, . _ - :), which no other set of this world has used; other ranks need
 * not call it. timeout_seconds from 0.001 to 1e9 replaces DDL_TIMEOUT for the set's ops (0: DDL_TIMEOUT). Members
 * that disagree on the list fail with DDL_ERROR_MISMATCH, or DDL_ERROR_BOOTSTRAP at the timeout.
 * ddl_process_set_destroy releases it on the calling rank. */
DDL_API ddl_status ddl_process_set_create_among(const int* ranks, int count, const char* key, double timeout_seconds, ddl_process_set* set);
/* Releases a set: collective over the whole world for a set made by ddl_process_set_create (like
 * create; its wait for the members bounded as ddl_finalize's), local for one made by
 * ddl_process_set_create_among. Operations still in flight on it fail. */
DDL_API ddl_status ddl_process_set_destroy(ddl_process_set set);
/* This rank's rank within the set (-1 if not a member), and the set's size. */
DDL_API ddl_status ddl_process_set_rank(ddl_process_set set, int* rank);
DDL_API ddl_status ddl_process_set_size(ddl_process_set set, int* size);
/* The set's world ranks, ascending, into ranks[0 .. size-1]. */
DDL_API ddl_status ddl_process_set_ranks(ddl_process_set set, int* ranks);

/* Options of the *_ex operations. Start from DDL_OP_OPTIONS_INIT. */
#define DDL_CUDA_BUFFERS 2u /* flag: the buffers are CUDA device memory, enqueued on `stream` */
/* flag: the op is done when the call returns, run on the calling thread as the blocking forms are;
 * `handle` may be NULL and is set to NULL. For ddl_allreduce_ex, ddl_broadcast_ex, ddl_allgather_ex,
 * ddl_allgatherv_ex, ddl_alltoall_ex and ddl_reducescatter_ex. With DDL_CUDA_BUFFERS the op is enqueued on `stream`
 * (by the calling thread, unless another thread is running libddl's rounds just then) and the call
 * returns once the GPU has finished it. */
#define DDL_BLOCKING 4u
/* flag: the op's name is its place in an order the caller counts alike on every rank (a torch
 * group's "allreduce.7"), as an unnamed op's number is libddl's. Such ops pair up only while every
 * rank made the same calls: once one of them fails in a way that shows the ranks' counts apart (a
 * timeout: some rank never submitted it; grouped calls of different sizes), every later one of the
 * process set fails at once on every rank, naming that failure, until the process set is made again,
 * ddl_init again, or a ddl_join renumbers them. A mismatch of an op every rank submitted, or a
 * ddl_fail_ex, leaves the order in step. Unnamed ops are ordered without the flag. */
#define DDL_ORDERED 8u
typedef struct {
  ddl_process_set process_set; /* NULL: the world */
  double prescale;             /* reductions: each rank's input is multiplied by it first (host buffers only) */
  double postscale;            /* reductions: the result is multiplied by it, after AVERAGE's division (host only) */
  unsigned flags;              /* DDL_COMPRESS_FP16, DDL_CUDA_BUFFERS, DDL_BLOCKING, DDL_ORDERED */
  void* stream;                /* a cudaStream_t with DDL_CUDA_BUFFERS (NULL: the default stream) */
  const long long* shape;      /* optional (ndim 0): the tensor's shape, which ranks must agree on; */
  int ndim;                    /* for allgatherv and alltoallv every dimension but the first */
  unsigned group_size;         /* the op is one of a grouped call of this many ops (0: not grouped), which ranks must agree on */
  /* optional (NULL): where the program made the call ("train.py:42"), which ranks must agree on too:
   * two calls alike from different places are a mismatch naming both (the Python faces pass it under
   * DDL_CHECK_CALL_SITES=1). Up to 256 bytes are compared. */
  const char* call_site;
} ddl_op_options;
#define DDL_OP_OPTIONS_INIT \
  { NULL, 1.0, 1.0, 0u, NULL, NULL, 0, 0u, NULL }

/* The general forms, asynchronous unless DDL_BLOCKING (an op refused at once fails in the call, as
 * above). Every other collective above is one of these with the options it stands for. Ranks and
 * roots are ranks within the process set. Scaling follows Horovod: integers scale in double and
 * truncate, 16-bit floats in float. */
DDL_API ddl_status ddl_allreduce_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype, ddl_reduce_op op,
                                    const ddl_op_options* options, ddl_handle* handle);
DDL_API ddl_status ddl_broadcast_ex(const char* name, void* buffer, size_t count, ddl_dtype dtype, int root, const ddl_op_options* options,
                                    ddl_handle* handle);
/* recv (set size * count elements) holds every rank's send, in rank order. */
DDL_API ddl_status ddl_allgather_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                    const ddl_op_options* options, ddl_handle* handle);
/* recv_counts[r] elements come from rank r of the set; this rank sends recv_counts[its rank]. */
DDL_API ddl_status ddl_allgatherv_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                                     const ddl_op_options* options, ddl_handle* handle);
/* An allgather whose per-rank counts only each rank knows (say, tensors whose first dimension
 * differs by rank): the counts are exchanged when the operation runs, and the result is kept with
 * the handle. Read it with ddl_gathered(), then release the handle with ddl_wait(). Host buffers. */
DDL_API ddl_status ddl_allgather_any_ex(const char* name, const void* send, size_t send_count, ddl_dtype dtype,
                                        const ddl_op_options* options, ddl_handle* handle);
/* Waits for a ddl_allgather_any_ex (or ddl_alltoall_any_ex) without releasing its handle and returns its status; on success
 * counts[r] (r < set size) is rank r's count and *data the gathered elements in rank order, valid
 * until ddl_wait(handle). */
DDL_API ddl_status ddl_gathered(ddl_handle handle, size_t* counts, const void** data);
/* send_counts[j] elements of `send` go to rank j (blocks in rank order), without knowing what will
 * arrive: libddl exchanges the counts when the op runs, and keeps what arrived with the handle.
 * ddl_gathered() gives counts[j] = elements received from rank j and *data = them in rank order.
 * Host buffers. */
DDL_API ddl_status ddl_alltoall_any_ex(const char* name, const void* send, const size_t* send_counts, ddl_dtype dtype,
                                       const ddl_op_options* options, ddl_handle* handle);
/* Block j of send (count elements) goes to rank j of the set; block j of recv comes from rank j.
 * Host buffers (for CUDA buffers, ddl_alltoallv_ex with equal counts). */
DDL_API ddl_status ddl_alltoall_ex(const char* name, const void* send, void* recv, size_t count, ddl_dtype dtype,
                                   const ddl_op_options* options, ddl_handle* handle);
/* send_counts[j] elements go to rank j (blocks in rank order); recv_counts[j] come from rank j.
 * Each rank passes its own counts, which must match its peers' (ranks learn them beforehand, e.g.
 * with an alltoall of the counts): when any rank's recv_counts[j] differs from what rank j sends it,
 * the op fails on every rank with DDL_ERROR_MISMATCH and writes nothing to recv. CUDA buffers
 * (DDL_CUDA_BUFFERS) go as NCCL sends and receives, after the same check of the counts on the host. */
DDL_API ddl_status ddl_alltoallv_ex(const char* name, const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                                    ddl_dtype dtype, const ddl_op_options* options, ddl_handle* handle);
/* send holds the sum of recv_counts elements on every rank; rank r receives the reduction of block r
 * (recv_counts[r] elements, blocks in rank order). Every rank passes the same recv_counts. CUDA
 * buffers go through ncclReduceScatter: equal blocks only (otherwise the op fails on every rank with
 * DDL_ERROR_UNSUPPORTED), no int16. */
DDL_API ddl_status ddl_reducescatter_ex(const char* name, const void* send, void* recv, const size_t* recv_counts, ddl_dtype dtype,
                                        ddl_reduce_op op, const ddl_op_options* options, ddl_handle* handle);
/* Horovod's join: returns once every rank of the set (NULL: the world) has called it, and meanwhile
 * takes part in the others' host allreduces and reducescatters (adding the reduction's identity:
 * zeros to SUM and AVERAGE, as Horovod; ones to PRODUCT, the largest value to MIN, the lowest to MAX)
 * and barriers, so ranks with fewer batches need not invent any. Other operations, and MIN, MAX or
 * PRODUCT with a prescale, fail on every rank (DDL_ERROR_UNSUPPORTED) while a rank waits here.
 * *last_rank is the last rank to join (within the set). */
DDL_API ddl_status ddl_join(ddl_process_set set, int* last_rank);

/* Takes the place of an op this rank found it cannot run (a bad argument only it can see, such as a
 * root's output list): under `name` (NULL: the next unnamed number) in options->process_set, with
 * options->flags' DDL_ORDERED and options->group_size as the op would have had, so that the other
 * ranks' op of that name fails too, with `reason` (non-empty) and this rank named, instead of
 * waiting for DDL_TIMEOUT or pairing with this rank's next call. Its handle's ddl_wait returns
 * DDL_ERROR_INVALID_ARGUMENT once every rank reached the op. An unnamed or DDL_ORDERED op the *_ex
 * functions refuse for its arguments (a dtype, a NULL buffer, a root out of range; not its options)
 * takes its place the same way by itself: the other ranks' op fails with the refusal's reason. A
 * refused named op takes none, so that the name can be submitted again at once. */
DDL_API ddl_status ddl_fail_ex(const char* name, const char* reason, const ddl_op_options* options, ddl_handle* handle);
/* Completes when every rank of the set (NULL: the world) has called it. A NULL handle makes it
 * blocking (as ddl_barrier, on the set). */
DDL_API ddl_status ddl_barrier_ex(ddl_process_set set, ddl_handle* handle);

/* Starts writing the timeline (Chrome-trace JSON, as DDL_TIMELINE) to `path`, closing any open one;
 * ddl_timeline_stop() closes it. As with DDL_TIMELINE, rank 0 writes `path` and the other ranks
 * nothing, unless "%r" in `path` (replaced by the rank) gives every rank its own file. */
DDL_API ddl_status ddl_timeline_start(const char* path);
DDL_API ddl_status ddl_timeline_stop(void);

/* Waits for the operation, releases the handle and returns its status. While no other thread is
 * running the runtime's negotiation rounds, the waiting thread runs them itself until its op is
 * done (as the blocking forms do), so the op completes without a hand-over from libddl's
 * background thread; ddl_gathered() waits the same way. */
DDL_API ddl_status ddl_wait(ddl_handle handle);
/* *done = 1 when the operation has finished (then ddl_wait returns at once), else 0. */
DDL_API ddl_status ddl_test(ddl_handle handle, int* done);

#ifdef __cplusplus
}
#endif

#endif /* DDL_DDL_H */
