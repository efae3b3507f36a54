"""ddl: the Python face of libddl, the collective runtime of ddl.

`ddl.torch` speaks Horovod's PyTorch API (`import ddl.torch as hvd`). The package is pure Python over
libddl's C ABI (ctypes), so one install serves every PyTorch version a site has.
"""

__version__ = "0.1.0"
