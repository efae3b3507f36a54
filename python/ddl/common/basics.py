"""Joining the world and what Horovod's API says about it, for every face: init/shutdown, ranks and
sizes (cross_rank/cross_size as Horovod means them), build flags, the timeline, join, HOROVOD_*
settings. A face re-exports these under Horovod's names."""

import atexit
import ctypes
import os
import sys

from ddl import _lib as L
from ddl.common import exceptions as _exceptions  # noqa: F401  (registers the status -> exception map)
from ddl.common import process_sets as _process_sets
from ddl.common import program_store as _program_store
from ddl.common.names import names

# Horovod's variables, honoured as aliases of libddl's when the DDL_* one is not set.
_ENV_ALIASES = {"HOROVOD_FUSION_THRESHOLD": "DDL_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME": "DDL_CYCLE_TIME_MS",
                "HOROVOD_TIMELINE": "DDL_TIMELINE"}

_topology = {}
_exit_state = {"hooked": False, "uncaught": False}
_shutdown_hooks = []  # a face's cleanup (its handles) after libddl finalizes


def _finalize_at_exit():
    """Under a PMIx launcher (mpirun, srun --mpi=pmix) a process that exits without finalizing is
    reported as failed, so leave cleanly at exit, as Horovod does; but not after an uncaught
    exception, where finalizing would wait for peers that may be waiting for this rank. Under
    `ddl run` nothing needs it, and a failing rank should exit at once."""
    if _exit_state["uncaught"] or not L.lib.ddl_is_initialized():
        return
    try:
        shutdown()
    except Exception:
        pass


def _hook_exit():
    if _exit_state["hooked"] or "DDL_STORE_ADDR" in os.environ or "PMIX_RANK" not in os.environ:
        return
    _exit_state["hooked"] = True
    previous = sys.excepthook

    def excepthook(*args):
        _exit_state["uncaught"] = True
        previous(*args)
    sys.excepthook = excepthook
    atexit.register(_finalize_at_exit)


def _apply_env_aliases():
    for horovod, ddl in _ENV_ALIASES.items():
        value = os.environ.get(horovod)
        # HOROVOD_TIMELINE=DYNAMIC means "started later with start_timeline()".
        if value and ddl not in os.environ and not (horovod == "HOROVOD_TIMELINE" and value == "DYNAMIC"):
            if horovod != "HOROVOD_TIMELINE":
                _require_number(horovod, value)  # named as the user set it, not as its DDL_* alias
            os.environ[ddl] = value


def _require_number(variable, value):
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not (number >= 0 and number != float("inf")):
        raise ValueError(f"{variable}={value!r} is not a non-negative number: fix it or unset it")


def on_shutdown(hook):
    """Registers a face's cleanup, run by shutdown() once libddl has finalized."""
    if hook not in _shutdown_hooks:
        _shutdown_hooks.append(hook)


def init(comm=None, process_sets=None):
    """Joins the world (a no-op if already initialized). `process_sets` are added right away;
    "dynamic" (Horovod's word for sets added later) adds none: ddl always lets them be added later.
    `comm`, as Horovod's, may list the world's ranks (every rank the launcher started: ddl's world
    is the launcher's) or be a communicator (mpi4py's) of that world."""
    if not L.lib.ddl_is_initialized():
        _apply_env_aliases()
        status = L.lib.ddl_init()
        if status != L.SUCCESS:
            L.raise_for(status)
        _after_joining()
    if comm is not None:
        _require_the_world(comm)
    for ps in _process_sets.as_new_sets(None if process_sets == "dynamic" else process_sets):
        _process_sets.add_process_set(ps)


def _require_the_world(comm):
    rank, size = L.int_out(L.lib.ddl_rank), L.int_out(L.lib.ddl_size)
    if hasattr(comm, "Get_size") and hasattr(comm, "Get_rank"):  # an MPI communicator (mpi4py)
        if (comm.Get_rank(), comm.Get_size()) != (rank, size):
            raise ValueError(f"init(comm=...): the communicator makes this process rank {comm.Get_rank()} of {comm.Get_size()}, "
                             f"but ddl's world (every rank the launcher started) has it as rank {rank} of {size}: "
                             "ddl cannot run on a part of the world; use a process set for a part")
        return
    try:
        ranks = sorted(int(r) for r in comm)
    except (TypeError, ValueError):
        raise ValueError(f"init(comm=...) takes a list of ranks or an MPI communicator, not {comm!r}") from None
    if ranks != list(range(size)):
        raise ValueError(f"init(comm={list(comm)!r}): ddl's world is every rank the launcher started (0 to {size - 1}); "
                         "it cannot run on a part of them: start only those, or use a process set (hvd.ProcessSet) for a part")


def launcher_gives_world():
    """Whether a launcher told this process its world: ddl run, a PMIx launcher (mpirun, srun
    --mpi=pmix) when libddl has PMIx, or DDL_BOOTSTRAP. Otherwise ddl_init's world is this process
    alone, and a program started by mp.spawn or torchrun joins its peers through a store instead.
    The same reading as libddl's (bootstrap_mode in runtime/src/api/startup.cpp)."""
    if "DDL_STORE_ADDR" in os.environ or os.environ.get("DDL_BOOTSTRAP"):
        return True
    return "PMIX_RANK" in os.environ and bool(L.lib.ddl_has_pmix())


def launcher_world_size():
    """The size of the world a launcher gave this process, where its variables tell it before
    ddl_init (ddl run's DDL_SIZE, mpirun's, PMI's, srun's); None where none does."""
    return _first_number_in("DDL_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")


def launcher_rank():
    """The rank a launcher gave this process, where its variables tell it before ddl_init (ddl run's
    DDL_RANK, mpirun's, PMI's, PMIx's, srun's); None where none does."""
    return _first_number_in("DDL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _first_number_in(*variables):
    """The value of the first of `variables` set to a number, or None."""
    for variable in variables:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return None


def started_by_multiprocessing():
    """Whether Python's multiprocessing started this process (mp.spawn, a Pool): then no launcher
    did, whatever launcher variables it inherited from its parent."""
    import multiprocessing
    return multiprocessing.parent_process() is not None


def init_through_store(store, rank, size):
    """Joins the world of `size` ranks as `rank` through `store`, a key-value store the program
    shares with its peers (torch.distributed's); a no-op if already initialized as that rank of
    that size (ValueError naming both worlds if as another)."""
    if L.lib.ddl_is_initialized():
        mine = (L.int_out(L.lib.ddl_rank), L.int_out(L.lib.ddl_size))
        if mine != (rank, size):
            raise ValueError(f"asked to join as rank {rank} of {size}, but ddl is initialized as rank {mine[0]} of "
                             f"{mine[1]} ({world_source()}): call shutdown() first, or pass the same rank and size")
        return
    _apply_env_aliases()
    _program_store.join(store, rank, size)
    _after_joining()


def world_source():
    """How this process found its world: "ddl run", "pmix", "program store" (a torch store under
    mp.spawn, torchrun or a plain srun) or "single"; "" before init()."""
    return L.lib.ddl_world_source().decode()


def _after_joining():
    _learn_topology()
    _process_sets._reset_global(_topology["size"])
    _hook_exit()
    if os.environ.get("DDL_DEBUG") == "1":
        print(f"ddl: rank {_topology['rank']} of {_topology['size']} (local rank {_topology['local_rank']} of "
              f"{_topology['local_size']}) joined through {world_source()}", file=sys.stderr, flush=True)


def _learn_topology():
    """Sizes of the world and its nodes; cross_size and is_homogeneous need every rank's placement."""
    rank, size = L.int_out(L.lib.ddl_rank), L.int_out(L.lib.ddl_size)
    local_rank, local_size = L.int_out(L.lib.ddl_local_rank), L.int_out(L.lib.ddl_local_size)
    node_rank = L.int_out(L.lib.ddl_node_rank)
    mine = (ctypes.c_int64 * 3)(local_rank, local_size, node_rank)
    everyone = (ctypes.c_int64 * (3 * size))()
    handle = ctypes.c_void_p()
    status = L.lib.ddl_allgatherv_ex(b"ddl.topology", mine, everyone, (ctypes.c_size_t * size)(*([3] * size)),
                                     L.INT64, None, ctypes.byref(handle))
    if status != L.SUCCESS:
        L.raise_for(status)
    status = L.lib.ddl_wait(handle)
    if status != L.SUCCESS:
        L.raise_for(status)
    rows = [everyone[3 * r:3 * r + 3] for r in range(size)]
    # Horovod's cross communicator: the ranks of this local rank, one per node that has it, in rank
    # order (on nodes of different sizes a rank's cross rank need not be its node's rank).
    _topology.update(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                     cross_rank=sum(1 for r in rows[:rank] if r[0] == local_rank),
                     cross_size=sum(1 for r in rows if r[0] == local_rank),
                     homogeneous=len({r[1] for r in rows}) == 1)


def shutdown():
    """Leaves the world (every rank must call it); init() may be called again afterwards."""
    if not L.lib.ddl_is_initialized():
        return
    # libddl first: it fails the ops still in flight (one that only some ranks submitted would
    # otherwise hold a face's cleanup until the timeout), then the faces free their handles.
    status = L.lib.ddl_finalize()
    for hook in _shutdown_hooks:
        hook()
    names.clear()
    _program_store.forget()
    _process_sets._forget_all()
    _topology.clear()
    if status == L.TIMEOUT:
        # This rank's work is done; some peer's is not (rank 0 still saving a checkpoint, say). An
        # error here would fail this process at its very end, and a launcher would then stop the
        # peer that is still at work: said, not raised, as Horovod's shutdown never raises.
        print(f"ddl: warning: {L.last_error()}", file=sys.stderr, flush=True)
    elif status != L.SUCCESS:
        L.raise_for(status)


def is_initialized():
    """Whether init() has been called (and shutdown() not since)."""
    return bool(L.lib.ddl_is_initialized())


def require(key):
    """The world's fact `key` (rank, size, ...); ValueError naming hvd.init() before init."""
    if not L.lib.ddl_is_initialized() or key not in _topology:
        raise ValueError("ddl has not been initialized; call hvd.init() first")
    return _topology[key]


def check_initialized():
    """Raises ValueError naming hvd.init() unless init() has been called."""
    if not L.lib.ddl_is_initialized():
        raise ValueError("ddl has not been initialized; call hvd.init() first")


def rank():
    """This process's rank in the world, 0 .. size() - 1. ValueError before init()."""
    return require("rank")


def size():
    """The number of ranks in the world. ValueError before init()."""
    return require("size")


def local_rank():
    """This process's rank among the ranks on its node (the GPU it pins by default)."""
    return require("local_rank")


def local_size():
    """The number of ranks on this process's node."""
    return require("local_size")


def cross_rank():
    """Horovod's cross rank: this rank's index among the ranks of its local rank (one per node that has
    one), in rank order; on nodes that each run as many ranks, its node's index."""
    return require("cross_rank")


def cross_size():
    """How many ranks share this rank's local rank (the nodes that have one); on evenly filled nodes,
    the node count."""
    return require("cross_size")


def is_homogeneous():
    """Whether every node runs the same number of ranks."""
    return require("homogeneous")


def _nccl_version_code():
    text = L.lib.ddl_nccl_version().decode()
    if not text:
        return 0
    major, minor, patch = (int(p) for p in text.split(".")[:3])
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def mpi_threads_supported():
    """False: ddl does not run over MPI (Horovod's API asks)."""
    return False


def mpi_built():
    """False: ddl has no MPI controller; it starts under mpirun through PMIx instead."""
    return False


def mpi_enabled():
    """False, as mpi_built()."""
    return False


def gloo_built():
    """True: libddl's host collectives include Gloo (between nodes)."""
    return True


def gloo_enabled():
    """True, as gloo_built()."""
    return True


def nccl_built():
    """NCCL's version code (e.g. 22805) of the NCCL libddl loads for CUDA tensors, else 0: as Horovod's.
    libddl loads it at run time (the one torch already loaded, DDL_NCCL_LIBRARY, or libnccl.so.2)."""
    return _nccl_version_code()


def ddl_built():
    """False: Horovod's "DDL" is IBM's library, which this ddl is not."""
    return False


def ccl_built():
    """False: no oneCCL."""
    return False


def cuda_built():
    """Whether CUDA tensors can be reduced: an NCCL loads for libddl (nccl_built() > 0)."""
    return _nccl_version_code() > 0


def rocm_built():
    """False: no ROCm."""
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline of the ops to `file_path`: rank 0 writes it, or every rank
    its own when the path holds "%r" (replaced by the rank)."""
    require("rank")
    path = os.fsencode(file_path)
    if b"\0" in path:  # a C string would end there: another file, silently
        raise ValueError(f"a timeline path cannot hold a NUL character: {file_path!r}")
    status = L.lib.ddl_timeline_start(path)
    if status != L.SUCCESS:
        L.raise_for(status)


def stop_timeline():
    """Stops the timeline and closes its file."""
    require("rank")
    status = L.lib.ddl_timeline_stop()
    if status != L.SUCCESS:
        L.raise_for(status)


def join():
    """Waits until every rank has joined, meanwhile adding zeros to the other ranks' allreduces (so ranks
    with fewer batches need not invent any). Returns the last rank to join. Broadcasts and allgathers
    fail on every rank while some rank waits here."""
    require("rank")
    last = ctypes.c_int(-1)
    status = L.lib.ddl_join(None, ctypes.byref(last))
    if status != L.SUCCESS:
        L.raise_for(status)
    return last.value  # libddl counts unnamed ops afresh after a join, on every rank alike


def world_rank():
    check_initialized()  # libddl's own error names ddl_init(), which a Horovod script never calls
    return L.int_out(L.lib.ddl_rank)
