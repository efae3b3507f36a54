"""Op names: ranks agree on ops by name, in any order, as in Horovod."""


class Names:
    """Op names per process set: explicit ones stay taken until their op is done, as in Horovod a name
    is in use until its op is done.

    An unnamed op has no name here (its full name is None): it goes to libddl without one, and
    libddl numbers it ("unnamed.N"), counting every unnamed op of the process set alike on every
    rank, the blocking calls' too (they run on the caller's thread without a name). One count for
    both: were the async path's ops counted here, an op that one rank runs blocking (a contiguous
    tensor) and another through the async path (a tensor that requires grad) would get two names,
    and wait for each other until DDL_TIMEOUT."""

    def __init__(self):
        self.taken = {}

    def claim(self, kind, name, process_set):
        key = process_set.process_set_id
        if name is None:
            return key, None
        full = f"{kind}.{name}"
        if "\0" in full:  # libddl's names are C strings: the rest would be cut off unseen
            raise ValueError(f"op names cannot hold a NUL character: {full!r}")
        taken = self.taken.get(key)  # not setdefault(key, set()): that makes a set per call (a hot path)
        if taken is None:
            taken = self.taken_in(key)
        if full in taken:
            raise ValueError(f"an op named '{full}' is already in flight on this rank: give concurrent ops "
                             "distinct names, or synchronize the first one before reusing its name")
        taken.add(full)
        return key, full

    def taken_in(self, key):
        """The set of names taken in process set `key`, the same object for as long as this lives
        (the compiled tensor path holds the world's: common/fastpath.py)."""
        taken = self.taken.get(key)
        if taken is None:
            taken = self.taken[key] = set()
        return taken

    @staticmethod
    def encoded(full):
        """A claimed full name as libddl takes it: bytes, or None for an unnamed op."""
        return None if full is None else full.encode()

    @staticmethod
    def part(full, i):
        """The name of part `i` of a grouped op ("NAME.i"); None for an unnamed op, each of whose
        parts libddl numbers."""
        return None if full is None else f"{full}.{i}"

    def release(self, key, full):
        taken = self.taken.get(key)
        if taken is not None and full is not None:
            taken.discard(full)

    def clear(self):
        for taken in self.taken.values():  # emptied, not dropped: see taken_in
            taken.clear()


names = Names()  # one for every face: an op's name is unique in the process, whichever face made it
