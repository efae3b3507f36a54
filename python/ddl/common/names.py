"""Op names: ranks agree on ops by name, in any order, as in Horovod."""


class Names:
    """Op names per process set: explicit ones stay taken until their op is done, as in Horovod a name
    is in use until its op is done; unnamed ops count up identically on every rank."""

    def __init__(self):
        self.taken = {}
        self.counters = {}
        self.epoch = 0

    def claim(self, kind, name, process_set):
        key = process_set.process_set_id
        if name is None:
            n = self.counters.get(key, 0)
            self.counters[key] = n + 1
            full = f"{kind}.noname.{self.epoch}.{n}"
        else:
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

    def restart_counting(self):
        """After a join every rank is at the same point again, whatever unnamed ops some ranks made
        while others had joined: count afresh, under a new epoch so no old name comes back."""
        self.counters.clear()
        self.epoch += 1

    def taken_in(self, key):
        """The set of names taken in process set `key`, the same object for as long as this lives
        (the compiled tensor path holds the world's: common/fastpath.py)."""
        taken = self.taken.get(key)
        if taken is None:
            taken = self.taken[key] = set()
        return taken

    def release(self, key, full):
        taken = self.taken.get(key)
        if taken is not None:
            taken.discard(full)

    def clear(self):
        for taken in self.taken.values():  # emptied, not dropped: see taken_in
            taken.clear()
        self.counters.clear()


names = Names()  # one for every face: an op's name is unique in the process, whichever face made it
