"""Allreduce bandwidth of torch.distributed (gloo, or --backend ddl; float32, sum, in place), nccl-tests style.

The peer of ddl_allreduce_bench (bench/allreduce_bench.cpp), with the same flags,
method and table. Start it with ddl run, which sets torchrun's environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ...); init_process_group("gloo")
then joins through env://:

    ddl run -np 2 -- /usr/bin/python3 bench/torch_allreduce_bench.py
    ddl run -np 4 -- /usr/bin/python3 bench/torch_allreduce_bench.py -e 256M

For every size from -b to -e (bytes, doubling): a barrier, warm-up iterations,
a barrier, then timed iterations of dist.all_reduce on a float32 tensor of that
size (a view of one preallocated buffer). Timed iterations per size =
clamp(--budget / size, --min-iters, -n); warm-up iterations = min(-w, that). time = mean over the timed iterations,
max over ranks; algbw = size / time (GB/s, 1e9 bytes); busbw = algbw * 2(n-1)/n.
#wrong: after the timed loop the buffer is refilled with element
i = (rank + 1) + i % 8, allreduced once more and compared with the exact sum
n(n+1)/2 + n(i % 8); total over ranks. Any wrong element: exit 1. The timed
loop reduces zeros, so that in-place sums stay finite.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def size_arg(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    mult = 1
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    value = int(float(t) * mult)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: negative size")
    return value


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-b", "--minbytes", type=size_arg, default=4)
    p.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    p.add_argument("-w", "--warmup", type=int, default=10)
    p.add_argument("-n", "--iters", type=int, default=200, help="most timed iterations per size")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--backend", default="gloo", help="torch.distributed backend: gloo, or ddl (libddl's)")
    p.add_argument("--budget", type=size_arg, default=1 << 30,
                   help="timed iterations per size = clamp(budget / size, min-iters, iters)")
    a = p.parse_args()
    a.minbytes = max(4, a.minbytes // 4 * 4)
    if a.maxbytes < a.minbytes or a.warmup < 0 or a.iters < 1 or not 1 <= a.min_iters <= a.iters:
        p.error("bad sizes or iteration counts")
    return a


def pattern(count, rank):
    return (torch.arange(count, dtype=torch.int64) % 8 + (rank + 1)).to(torch.float32)


def main():
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.backend == "ddl":
        import ddl.distributed  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(args.maxbytes // 4, dtype=torch.float32)
    bus_factor = 2.0 * (size - 1) / size if size > 1 else 1.0
    if rank == 0:
        print(f"# impl torch-{args.backend} (torch {torch.__version__}), ranks {size}, float32 sum, in place, "
              f"warmup min({args.warmup}, iters), iters clamp({args.budget}/size, {args.min_iters}, {args.iters})")
        print("# %12s %12s %6s %12s %12s %12s %8s" % ("size(B)", "count", "iters", "time(us)",
                                                   "algbw(GB/s)", "busbw(GB/s)", "#wrong"), flush=True)
    total_wrong = 0
    busbws = []
    nbytes = args.minbytes
    while nbytes <= args.maxbytes:
        count = nbytes // 4
        iters = min(args.iters, max(args.min_iters, args.budget // nbytes))
        t = buf[:count]
        t.zero_()  # in-place sums of zeros stay finite however many iterations run

        dist.barrier()
        for _ in range(min(args.warmup, iters)):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t1 = time.perf_counter()
        us = torch.tensor([(t1 - t0) * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        us = us.item()

        t.copy_(pattern(count, rank))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        base = size * (size + 1) // 2
        expected = (torch.arange(count, dtype=torch.int64) % 8 * size + base).to(torch.float32)
        wrong = torch.tensor([int((t != expected).sum().item())], dtype=torch.int64)
        dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
        wrong = int(wrong.item())
        total_wrong += wrong

        algbw = nbytes / (us * 1e3)
        busbw = algbw * bus_factor
        busbws.append(busbw)
        if rank == 0:
            print("  %12d %12d %6d %12.2f %12.4f %12.4f %8d" % (nbytes, count, iters, us, algbw, busbw, wrong),
                  flush=True)
        nbytes *= 2
    if rank == 0:
        print("# avg busbw (GB/s): %.4f" % (sum(busbws) / len(busbws) if busbws else 0.0))
        print("# check: %s (%d wrong elements)" % ("ok" if total_wrong == 0 else "FAILED", total_wrong), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if total_wrong == 0 else 1)


if __name__ == "__main__":
    main()
