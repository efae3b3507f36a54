"""Python runs this at start-up in the workers of `ddl run --torch-backend ddl`, which puts this
folder first on PYTHONPATH and sets DDL_TORCH_BACKEND: torch.distributed's init_process_group then
makes the world's group on libddl's "ddl" backend, whatever backend the script names (gloo, nccl, or
none), and so do new_group calls that name no backend; an unmodified DDP or Lightning script trains
on libddl.

It runs the sitecustomize it shadows (a site's or the distribution's) after installing itself,
and makes ddl's own package importable when the program's path lacks it. Nothing of torch is imported here: the
change is made when the program imports torch.distributed.
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


def _with_backend(function, backend):
    """`function` (init_process_group) with its `backend` argument replaced."""
    import functools
    import inspect
    signature = inspect.signature(function)

    @functools.wraps(function)
    def replaced(*args, **kwargs):
        import ddl.distributed  # noqa: F401  (registers the backend; torch.distributed is whole by now)
        bound = signature.bind(*args, **kwargs)
        asked = bound.arguments.get("backend")
        bound.arguments["backend"] = backend
        if asked not in (None, backend) and os.environ.get("RANK") == "0":
            print(f"ddl: init_process_group({asked!r}) runs on backend {backend!r} (ddl run --torch-backend {backend})",
                  file=sys.stderr, flush=True)
        return function(*bound.args, **bound.kwargs)

    return replaced


class _PatchingLoader:
    """The loader of torch.distributed.distributed_c10d, wrapped: after the module has run, its
    init_process_group is replaced, before torch.distributed copies it. (new_group is left alone: with
    no backend it takes the default group's, ddl; a backend it names, say gloo for send/recv, stays.)
    Everything else is the wrapped loader's, which may be shared with other modules."""

    def __init__(self, loader, backend):
        self._loader = loader
        self._backend = backend

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.init_process_group = _with_backend(module.init_process_group, self._backend)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _ReplaceBackendOnImport:
    """Finds torch.distributed.distributed_c10d as Python would, with a loader that patches it."""

    def __init__(self, backend):
        self.backend = backend

    def find_spec(self, name, path=None, target=None):
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.backend)
        return spec


def _install():
    backend = os.environ.get("DDL_TORCH_BACKEND")
    if not backend:
        return
    if importlib.util.find_spec("ddl") is None:
        sys.path.append(_PACKAGE_ROOT)
    sys.meta_path.insert(0, _ReplaceBackendOnImport(backend))


_install()  # first: a shadowed sitecustomize that fails must not leave the job on the script's backend
_run_shadowed_sitecustomize()
