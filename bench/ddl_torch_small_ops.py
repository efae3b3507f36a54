"""Latency of small blocking ddl.torch calls, as a training loop makes them for metrics:

    ddl run -np 2 -- env PYTHONPATH=build/python /usr/bin/python3 bench/ddl_torch_small_ops.py [--calls 5000]

Per call, in µs (rank 0's mean over --calls calls after 200 warm-up ones): hvd.allreduce of a
1-element float32 tensor under one name (a new output tensor each call), hvd.allreduce_ in place
(Sum), and hvd.barrier()."""
import argparse
import time

import torch

import ddl.torch as hvd


def timed(calls, fn):
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    a = p.parse_args()
    hvd.init()
    t = torch.ones(1)
    results = {
        "allreduce": timed(a.calls, lambda: hvd.allreduce(t, name="bench.metric")),
        "allreduce_": timed(a.calls, lambda: hvd.allreduce_(t, name="bench.inplace", op=hvd.Sum)),
        "barrier": timed(a.calls, hvd.barrier),
    }
    if hvd.rank() == 0:
        print(f"ddl.torch, {hvd.size()} ranks, us per call: " + ", ".join(f"{k} {v:.1f}" for k, v in results.items()))
    hvd.shutdown()


if __name__ == "__main__":
    main()
