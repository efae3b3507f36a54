"""Horovod's process sets over libddl's (ddl_process_set_*): subgroups of ranks with their own ops."""

import ctypes
import numbers

from ddl import _lib as L

_registry = {}  # process_set_id -> ProcessSet, for the sets added since init


class ProcessSet:
    """A set of world ranks. Register it on every rank with add_process_set() (or init(process_sets=...))
    before using it as `process_set=` of an op."""

    def __init__(self, ranks):
        self.ranks = _sorted_ranks(ranks)
        self.process_set_id = None
        self._c_handle = None

    def _world_rank(self):
        return L.int_out(L.lib.ddl_rank)

    def size(self):
        if self.process_set_id is None:
            return None
        return L.int_out(L.lib.ddl_size) if self.process_set_id == 0 else len(self.ranks)

    def rank(self):
        """This rank's rank within the set, -1 if it is not a member (None before the set is added)."""
        if self.process_set_id is None:
            return None
        me = self._world_rank()
        if self.process_set_id == 0:
            return me
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        if self.process_set_id is None:
            return None
        return self.process_set_id == 0 or self._world_rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


def _sorted_ranks(ranks):
    """The world ranks of a ProcessSet, sorted: any iterable of integers, as Horovod takes (a list, a
    range, reversed(...), a numpy array), and nothing else."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise ValueError(f"ProcessSet takes an iterable of ranks, not {type(ranks).__name__} "
                         "(mpi4py communicators are not supported by ddl)")
    ranks = list(ranks)
    if not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in ranks):
        raise ValueError(f"ProcessSet takes integer ranks, not {ranks!r}")
    # libddl takes C ints: 2**32 + 1 would pass on as rank 1, a set other than the one asked for.
    for r in ranks:
        if not 0 <= r < 2**31:
            raise ValueError(f"ProcessSet rank {int(r)} is out of range: ranks run from 0 to the world's size - 1")
    return sorted(int(r) for r in ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _reset_global(size):
    global_process_set.ranks = list(range(size))
    global_process_set.process_set_id = 0


def as_new_sets(process_sets):
    """The ProcessSets that init(process_sets=...) is to add (those not added yet), checked all at once
    before any is added, so that a bad list adds none and init can be called again: no two alike, none
    like the world's or one already added."""
    sets = [ps if isinstance(ps, ProcessSet) else ProcessSet(ps) for ps in process_sets or []]
    new = [ps for ps in sets if ps.process_set_id is None]
    taken = [global_process_set.ranks] + [other.ranks for other in _registry.values()]
    for ps in new:
        if ps.ranks in taken:
            raise ValueError(f"a process set with ranks {ps.ranks} already exists (or is given twice)")
        taken.append(ps.ranks)
    return new


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) on every rank; all ranks must call it,
    in the same order. Returns the ProcessSet."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if not L.lib.ddl_is_initialized():
        raise ValueError("ddl has not been initialized; call hvd.init() first")
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} was already added")
    if ps.ranks == global_process_set.ranks or any(other.ranks == ps.ranks for other in _registry.values()):
        raise ValueError(f"a process set with ranks {ps.ranks} already exists")
    arr = (ctypes.c_int * len(ps.ranks))(*ps.ranks)
    handle = ctypes.c_void_p()
    status = L.lib.ddl_process_set_create(arr, len(ps.ranks), ctypes.byref(handle))
    if status != L.SUCCESS:
        L.raise_for(status)
    ps._c_handle = handle.value
    ps.process_set_id = handle.value
    _registry[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Removes a process set on every rank (all must call it). Returns False if it was not added."""
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False
    if process_set.process_set_id not in _registry:
        return False
    status = L.lib.ddl_process_set_destroy(ctypes.c_void_p(process_set._c_handle))
    del _registry[process_set.process_set_id]
    process_set.process_set_id = None
    process_set._c_handle = None
    if status != L.SUCCESS:
        L.raise_for(status)
    return True


def _forget_all():
    for ps in _registry.values():
        ps.process_set_id = None
        ps._c_handle = None
    _registry.clear()
