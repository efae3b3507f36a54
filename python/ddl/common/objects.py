"""broadcast_object and allgather_object of every face: how an object becomes bytes, and how a rank
whose object does not says so to the others.

Each rank serializes before any collective starts. A rank that fails there must still take part in
the length exchange, or its next call would pair with the others' pending one (same op names) and
hand them the wrong object: it sends the length NOT_SERIALIZED instead, every rank sees it, and
all raise together; the exchange of the data is then skipped everywhere.
"""

import pickle

try:  # as Horovod: functions, lambdas and closures travel too
    import cloudpickle as pickler
except ImportError:  # plain pickle: module-level objects only
    pickler = pickle

NOT_SERIALIZED = -1

_WITHOUT_CLOUDPICKLE = ("; lambdas, closures and locally defined classes need cloudpickle "
                        "(pip install cloudpickle), which ddl uses where it is installed, as Horovod does")


def serialized(obj, dump):
    """(bytes, None) from `dump(obj)`, or (None, the exception it raised)."""
    try:
        return dump(obj), None
    except Exception as e:  # noqa: BLE001 — raised again by raise_if_not_serialized, on every rank
        return None, e


def dumps(obj):
    """`obj` pickled by cloudpickle where installed, else by pickle."""
    return pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def length_of(payload):
    """What a rank announces: its payload's length, or NOT_SERIALIZED."""
    return NOT_SERIALIZED if payload is None else len(payload)


def raise_if_not_serialized(what, lengths, ranks, error):
    """Raises on every rank when any of `ranks` (set ranks, in the order of `lengths`) announced
    NOT_SERIALIZED: this rank's own `error` where it is one of them, else a RuntimeError naming them."""
    if error is not None:
        # What cloudpickle would have sent (pickle refuses functions it cannot find by name)
        if pickler is pickle and isinstance(error, (pickle.PicklingError, AttributeError)) and hasattr(error, "add_note"):
            error.add_note(f"ddl {what}: this object could not be pickled" + _WITHOUT_CLOUDPICKLE)
        raise error
    failed = [r for r, n in zip(ranks, lengths) if n == NOT_SERIALIZED]
    if failed:
        who = f"rank {failed[0]}" if len(failed) == 1 else f"ranks {', '.join(map(str, failed))}"
        raise RuntimeError(f"{what}: {who} could not serialize its object (the error is raised there); "
                           "nothing was sent")
