"""libddl's world through a key-value store the program already shares with its peers: the store
torch.distributed made under mp.spawn, torchrun or a plain srun (any object with torch's
``set(key, bytes)``, ``get(key)`` and ``wait([keys], timedelta)``).

libddl calls the store while it joins the world and while it makes process sets, so the store is
kept here until the world ends. A store that goes away with its owner (torch's default group,
destroyed) is let go with `release` and a later one put in its place with `use`: libddl's world
stays, and only process sets made in between would find no store.
"""

import ctypes
import datetime

from ddl import _lib as L


class _Bridge:
    """The ddl_store libddl calls, over whichever store is in use now."""

    def __init__(self, store):
        self.store = store
        self.last_failure = ""
        # The ctypes callbacks must live as long as libddl may call them.
        self._set = L.STORE_SET(self._on_set)
        self._get = L.STORE_GET(self._on_get)
        self.c_store = L.Store(None, self._set, self._get)

    def _on_set(self, _context, key, value, size):
        try:
            self._require().set(key.decode(), ctypes.string_at(value, size))
            return 0
        except Exception as e:  # an exception must not cross into libddl
            self.last_failure = f"{type(e).__name__}: {e}"
            return 1

    def _on_get(self, _context, key, timeout_ms, deliver, sink):
        try:
            store = self._require()
            name = key.decode()
            store.wait([name], datetime.timedelta(milliseconds=max(int(timeout_ms), 1)))
            value = store.get(name)
            deliver(sink, value, len(value))
            return 0
        except Exception as e:
            self.last_failure = f"{type(e).__name__}: {e}"
            return 1

    def _require(self):
        if self.store is None:
            raise RuntimeError("the store libddl's world was made through is gone (its torch group was destroyed): "
                               "call init_process_group again before making process sets")
        return self.store


_bridge = None


def join(store, rank, size):
    """Joins libddl's world of `size` ranks as `rank` through `store`; raises the face's error
    (ddl_status BOOTSTRAP) with what the store said when it fails."""
    global _bridge
    bridge = _Bridge(store)
    status = L.lib.ddl_init_with_store(rank, size, ctypes.byref(bridge.c_store))
    if status != L.SUCCESS:
        said = f" (the store said: {bridge.last_failure})" if bridge.last_failure else ""
        L.raise_for(status, L.last_error() + said)
    _bridge = bridge


def joined_through_store():
    """Whether libddl's world was made through a program's store (and it is still up)."""
    return _bridge is not None and L.lib.ddl_is_initialized() and L.lib.ddl_world_source() == b"program store"


def use(store):
    """Makes `store` the one libddl's process sets rendezvous through from now on."""
    if _bridge is not None:
        _bridge.store = store


def release(store):
    """Lets go of `store` if it is the one in use (its owner is going away)."""
    if _bridge is not None and _bridge.store is store:
        _bridge.store = None


def forget():
    """After libddl's world ended: nothing calls the store any more."""
    global _bridge
    _bridge = None
