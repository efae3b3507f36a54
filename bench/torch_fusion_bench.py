"""Many small allreduces per "training step" with torch.distributed (gloo): the peer of
build/bench/ddl_fusion_bench (bench/fusion_bench.cpp), with the same step, checks and table.

    ddl run -np 2 -- /usr/bin/python3 bench/torch_fusion_bench.py                 # --mode loop
    ddl run -np 2 -- /usr/bin/python3 bench/torch_fusion_bench.py --mode async
    ddl run -np 2 -- /usr/bin/python3 bench/torch_fusion_bench.py --mode flat

A step allreduces (sum, in place) --tensors float32 tensors of --floats elements:
  loop   one blocking dist.all_reduce per tensor (1000 calls per step by default)
  async  dist.all_reduce(async_op=True) for every tensor, then wait() on every work
         (ProcessGroupGloo runs them in order on its worker threads; no fusion)
  flat   copy every tensor into one flat buffer, one all_reduce, copy back: what
         DDP's gradient buckets do, i.e. the ideal that fusion aims at
--warmup steps, then --steps timed steps. Reported: step time in ms, the mean
over the timed steps (max over ranks), and the fastest step (max over ranks of
each rank's fastest). #wrong: every tensor is then refilled with element j of
tensor t = (rank + 1) + (t + j) % 8, one more step is run, and elements that
differ from n(n+1)/2 + n((t + j) % 8) are counted over all ranks; any: exit 1.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--floats", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", choices=["loop", "async", "flat"], default="loop")
    a = p.parse_args()
    if a.tensors < 1 or a.floats < 1 or a.warmup < 0 or a.steps < 1:
        p.error("counts must be positive")
    return a


def main():
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    grads = [torch.empty(args.floats, dtype=torch.float32) for _ in range(args.tensors)]
    flat = torch.empty(args.tensors * args.floats, dtype=torch.float32)
    j = torch.arange(args.floats, dtype=torch.int64)

    def fill():
        for t, g in enumerate(grads):
            g.copy_((j + t) % 8 + (rank + 1))

    def step():
        if args.mode == "loop":
            for g in grads:
                dist.all_reduce(g)
        elif args.mode == "async":
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()
        else:
            torch.cat(grads, out=flat)
            dist.all_reduce(flat)
            for g, part in zip(grads, flat.split(args.floats)):
                g.copy_(part)

    if rank == 0:
        print(f"# impl torch-gloo-{args.mode} (torch {torch.__version__}), ranks {size}, "
              f"{args.tensors} tensors x {args.floats} float32, warmup {args.warmup}")
        print("# %9s %9s %6s %12s %12s %8s" % ("tensors", "floats", "steps", "step(ms)", "min(ms)", "#wrong"),
              flush=True)
    fill()
    for _ in range(args.warmup):
        step()
    dist.barrier()
    total, fastest = 0.0, float("inf")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        ms = (time.perf_counter() - t0) * 1e3
        total += ms
        fastest = min(fastest, ms)
    times = torch.tensor([total / args.steps, fastest], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)

    fill()
    step()
    base = size * (size + 1) // 2
    wrong = 0
    for t, g in enumerate(grads):
        wrong += int((g != ((j + t) % 8 * size + base).to(torch.float32)).sum().item())
    wrong_t = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(wrong_t)
    wrong = int(wrong_t.item())
    if rank == 0:
        print("  %9d %9d %6d %12.3f %12.3f %8d" % (args.tensors, args.floats, args.steps, times[0].item(),
                                                 times[1].item(), wrong))
        print("# check: %s (%d wrong elements)" % ("ok" if wrong == 0 else "FAILED", wrong), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if wrong == 0 else 1)


if __name__ == "__main__":
    main()
