"""DDL_CHECK_CALL_SITES=1: every op carries the place in the program that made it ("train.py:42"),
and ranks agree on it as on the op's shape. Ops numbered by their order (unnamed ops, a torch group's
ops) pair up by that number alone, so a rank that skips a call whose tensors equal the next one's
(`if rank == 0: dist.all_reduce(t)`) pairs its next call with the others' skipped one, silently;
with call sites the two places differ, and the op fails on every rank naming both. Off by default:
finding the caller walks the Python stack on every op (its cost is in docs/libddl.md)."""
import os
import sys

ENABLED = os.environ.get("DDL_CHECK_CALL_SITES", "") == "1"

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the ddl package
_FRAMEWORKS = ("torch", "tensorflow", "keras", "tf_keras")


_dirs = (0, ())  # (len(sys.modules) when found, the folders)


def _library_dirs():
    """Folders whose frames are not the program's: ddl's own, and the frameworks' (torch.distributed
    calls the backend, Keras calls the optimizer). Found again only when modules were imported since."""
    global _dirs
    if _dirs[0] != len(sys.modules):
        found = [_PACKAGE]
        for name in _FRAMEWORKS:
            path = getattr(sys.modules.get(name), "__file__", None)
            if path:
                found.append(os.path.dirname(os.path.abspath(path)) + os.sep)
        _dirs = (len(sys.modules), tuple(found))
    return _dirs[1]


def caller():
    """b"FILE:LINE" of the innermost frame outside ddl and the frameworks (the file's base name, which
    is the same on every rank however each reaches the script); None if there is none (a
    framework's own thread)."""
    skip = _library_dirs()
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<") and not path.startswith(skip):  # a module's co_filename is absolute
            return f"{os.path.basename(path)}:{frame.f_lineno}".encode()
        frame = frame.f_back
    return None
