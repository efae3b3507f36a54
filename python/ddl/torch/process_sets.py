"""Horovod's process sets for ddl.torch: the shared ones of ddl.common (one registry for every face)."""

from ddl.common.process_sets import (ProcessSet, global_process_set, add_process_set, remove_process_set,  # noqa: F401
                                     _registry)
