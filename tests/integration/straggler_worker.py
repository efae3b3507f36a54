"""A training loop with a straggler made on purpose, for `ddl run --report-stragglers`
(test_stragglers.py): `straggler_worker.py RANK STEPS SECONDS` runs STEPS allreduces of one named
gradient, rank RANK sleeping SECONDS before each (a slow data loader on one node)."""
import sys
import time

import torch

import ddl.torch as hvd

slow_rank, steps, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
hvd.init()
for step in range(steps):
    if hvd.rank() == slow_rank:
        time.sleep(pause)
    hvd.allreduce(torch.ones(16), name="grad")
print("done", flush=True)
