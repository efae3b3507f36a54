"""Python runs this at start-up in the workers of `ddl run`, which puts this folder first on
PYTHONPATH (when ddl's package lies beside the `ddl` command). Nothing of torch is imported here: the
change is made when the program imports torch.distributed, and only there.

- Always: torch.distributed's init_process_group and new_group, asked for the "ddl" backend
  ("ddl", "cpu:ddl,cuda:ddl", ...), import ddl.distributed first, which registers it, so a script
  needs no `import ddl.distributed` of its own. Other backends import nothing of ddl.
- With `ddl run --torch-backend ddl` (DDL_TORCH_BACKEND=ddl): init_process_group makes the world's
  group on libddl's "ddl" backend, whatever backend the script names (gloo, nccl, or none), and so
  do new_group calls that name no backend; an unmodified DDP or Lightning script trains on libddl.
- With DDL_WATCH_DIR and DDL_STACKS_SIGNAL (set by the supervisor that started the worker, for its
  hang watchdog and Ctrl-\\): faulthandler writes every thread's stack to
  DDL_WATCH_DIR/rank.N.PID.stacks on that signal. The file appears only once the handler is in
  place, and the supervisor signals only processes that hold their file open, since the signal's
  default would end the process.

It runs the sitecustomize it shadows (a site's or the distribution's) after installing itself, and
makes ddl's own package importable when the program's path lacks it.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(_HERE))  # the folder that holds ddl/
_C10D = "torch.distributed.distributed_c10d"


def _run_shadowed_sitecustomize():
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _import_ddl_distributed():
    """Registers the "ddl" backend (torch.distributed is whole by the time a group is made)."""
    if importlib.util.find_spec("ddl") is None:
        sys.path.append(_PACKAGE_ROOT)
    import ddl.distributed  # noqa: F401


def _names_ddl(backend):
    """Whether a backend argument ("ddl", Backend("ddl"), "cpu:gloo,cuda:ddl") asks for ddl's."""
    import re
    if backend is None:
        return False
    return any(part.strip() == "ddl" for part in re.split(r"[,:]", str(backend).lower()))


def _registering_ddl(function):
    """`function` (init_process_group or new_group), registering ddl's backend first when asked for it."""
    import functools
    import inspect
    signature = inspect.signature(function)

    @functools.wraps(function)
    def registering(*args, **kwargs):
        try:
            asked = signature.bind(*args, **kwargs).arguments.get("backend")
        except TypeError:  # torch's own call gives the error
            asked = None
        if _names_ddl(asked):
            _import_ddl_distributed()
        return function(*args, **kwargs)

    return registering


def _with_backend(function, backend):
    """`function` (init_process_group) with its `backend` argument replaced."""
    import functools
    import inspect
    signature = inspect.signature(function)

    @functools.wraps(function)
    def replaced(*args, **kwargs):
        _import_ddl_distributed()
        bound = signature.bind(*args, **kwargs)
        asked = bound.arguments.get("backend")
        bound.arguments["backend"] = backend
        if asked not in (None, backend) and os.environ.get("RANK") == "0":
            print(f"ddl: init_process_group({asked!r}) runs on backend {backend!r} (ddl run --torch-backend {backend})",
                  file=sys.stderr, flush=True)
        return function(*bound.args, **bound.kwargs)

    return replaced


def _replace_backend(module, backend):
    """--torch-backend: the world's group on `backend` (new_group with no backend takes the default
    group's; a backend it names, say gloo for send/recv, stays)."""
    module.init_process_group = _with_backend(module.init_process_group, backend)


def _register_when_named(module):
    module.init_process_group = _registering_ddl(module.init_process_group)
    module.new_group = _registering_ddl(module.new_group)


class _PatchingLoader:
    """The loader of torch.distributed.distributed_c10d, wrapped: after the module has run, `patch`
    changes it, before torch.distributed copies its functions. Everything else is the wrapped
    loader's, which may be shared with other modules."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PatchTorchDistributedOnImport:
    """Finds torch.distributed.distributed_c10d as Python would, with a loader that patches it."""

    def __init__(self, patch):
        self.patch = patch

    def find_spec(self, name, path=None, target=None):
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


def _install():
    backend = os.environ.get("DDL_TORCH_BACKEND")
    if backend:
        if importlib.util.find_spec("ddl") is None:
            sys.path.append(_PACKAGE_ROOT)
        def patch(module):
            _replace_backend(module, backend)
    else:
        patch = _register_when_named
    sys.meta_path.insert(0, _PatchTorchDistributedOnImport(patch))


def _register_stack_dump():
    folder = os.environ.get("DDL_WATCH_DIR")
    number = os.environ.get("DDL_STACKS_SIGNAL")
    rank = os.environ.get("DDL_RANK") or os.environ.get("RANK")
    if not folder or not number or not rank:
        return
    global _STACKS_FILE
    path = os.path.join(folder, f"rank.{rank}.{os.getpid()}.stacks")
    try:
        import faulthandler
        stacks = open(path + ".new", "w")
        try:
            faulthandler.register(int(number), file=stacks, all_threads=True, chain=False)
            os.rename(path + ".new", path)
        except BaseException:
            faulthandler.unregister(int(number))
            stacks.close()
            os.unlink(path + ".new")
            raise
    except (OSError, ValueError, RuntimeError, AttributeError):
        return  # no stacks from this process: the watchdog still goes by its output and libddl's ops
    _STACKS_FILE = stacks  # faulthandler writes to its descriptor: it stays open as long as the process


_STACKS_FILE = None
_register_stack_dump()
_install()  # first: a shadowed sitecustomize that fails must not leave the job on the script's backend
_run_shadowed_sitecustomize()
