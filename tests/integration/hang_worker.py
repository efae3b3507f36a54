"""A training-like program that hangs on purpose, for ddl run's hang watchdog (test_hangs.py and
the host and Slurm tests). argv[1]:
- barrier_skipped: every rank but the last waits in a libddl barrier that the last rank skipped; the
  last sleeps in a loop of its own (a data loader that never returns).
- quiet_allreduces SECONDS: allreduces for that long without a word, then "done": not a hang.
- quiet SECONDS: nothing at all for that long (no output, no op), then "done".
Each rank prints "ready" once ddl.torch is initialized."""
import os
import sys
import time

import torch

import ddl.torch as hvd


def wait_at_barrier():
    hvd.barrier()


def load_batch():
    while True:
        time.sleep(0.05)


def quiet_allreduces(seconds):
    # Every rank stops after the same op: each says whether its own time is up, and the first that
    # is stops them all (each rank's clock started at its own hvd.init; one that went on alone
    # would find its peer gone).
    end = time.monotonic() + seconds
    while hvd.allreduce(torch.tensor([float(time.monotonic() >= end)]), name="grad", op=hvd.Max).item() == 0:
        time.sleep(0.01)


hvd.init()
print("ready", flush=True)
mode = sys.argv[1]
if mode == "barrier_skipped":
    if hvd.rank() == hvd.size() - 1:
        load_batch()
    wait_at_barrier()
elif mode == "quiet_allreduces":
    quiet_allreduces(float(sys.argv[2]))
elif mode == "quiet":
    time.sleep(float(sys.argv[2]))
print("done", flush=True)
os._exit(0)
