"""What this install of ddl's Python package can do: the faces' part of `ddl check-build`.

`ddl check-build` runs ``python -m ddl.capabilities FACE`` in the user's Python and shows the one JSON
line it prints; a user can run the same to see what a given Python finds::

    $ python -m ddl.capabilities torch
    {"version": "0.1.0", "detail": "Horovod API on torch 2.5.1; NCCL 2.28.3 for CUDA tensors (...); ..."}

A face that does not import raises its ImportError (``No module named 'torch'``) and the command
exits non-zero: check-build reads the missing module's name from it.
"""

import json
import sys

FACES = ("torch", "tensorflow")


def torch_face():
    """What ``ddl.torch`` (Horovod's PyTorch API) offers here.

    Returns:
        dict: ``version`` (ddl's) and ``detail`` (torch's version, NCCL for CUDA tensors or host
        tensors only, whether the per-op calls are compiled, the libddl loaded).

    Raises:
        ImportError: torch, or libddl, does not load.
    """
    import torch

    import ddl
    import ddl.torch as hvd
    from ddl import _lib
    from ddl.common import fastpath

    lib = _lib.lib
    if hvd.nccl_built():
        tensors = "NCCL %s for CUDA tensors (%s, %s)" % (
            lib.ddl_nccl_version().decode(), lib.ddl_nccl_path().decode(), lib.ddl_nccl_origin().decode())
    else:
        tensors = "host tensors only (no NCCL)"
    calls = ("per-op calls compiled" if fastpath.compiled
             else "per-op calls through ctypes (%s)" % fastpath.why_not_compiled)
    return {"version": ddl.__version__,
            "detail": "Horovod API on torch %s; %s; %s; libddl %s" % (torch.__version__, tensors, calls, lib._name)}


def tensorflow_face():
    """What ``ddl.tensorflow`` and ``ddl.keras`` (Horovod's TensorFlow and Keras APIs) offer here.

    Returns:
        dict: ``version`` (ddl's) and ``detail`` (TensorFlow's and Keras's versions, the libddl loaded).

    Raises:
        ImportError: TensorFlow, Keras or libddl does not load.
    """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import ddl
    import ddl.keras  # noqa: F401  (the Keras face loads with the TensorFlow one)
    import ddl.tensorflow  # noqa: F401
    from ddl import _lib

    keras_version = getattr(tf.keras, "__version__", None) or __import__("keras").__version__
    return {"version": ddl.__version__,
            "detail": "Horovod TensorFlow and Keras APIs on tensorflow %s, Keras %s; host tensors (GPU tensors "
                      "through the host); libddl %s" % (tf.__version__, keras_version, _lib.lib._name)}


def describe(face):
    """One face's answer, as `torch_face` or `tensorflow_face` gives it.

    Raises:
        ValueError: `face` is not one of FACES.
    """
    if face == "torch":
        return torch_face()
    if face == "tensorflow":
        return tensorflow_face()
    raise ValueError("unknown face %r: one of %s" % (face, ", ".join(FACES)))


def main(argv):
    if len(argv) != 1 or argv[0] not in FACES:
        print("usage: python -m ddl.capabilities {%s}" % "|".join(FACES), file=sys.stderr)
        return 2
    print(json.dumps(describe(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
