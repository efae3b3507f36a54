"""Allreduce of CUDA tensors: ddl.torch (libddl over NCCL) and torch.distributed's `ddl` backend
beside torch.distributed's own NCCL backend, in one run, on the same GPUs and tensors. One worker
per GPU:

    ddl run -np <GPUs> -- /usr/bin/python3 bench/gpu_allreduce_bench.py [-b 4] [-e 256M]

ddl run sets torchrun's variables, so init_process_group("nccl") joins through env://. For every
size from -b to -e (bytes, float32, doubling), each peer in turn: warm-up iterations, then timed
iterations of a blocking in-place sum (ddl: hvd.allreduce_, which returns once the result is in the
tensor; ddl-backend and torch: dist.all_reduce on a `ddl` group or the default `nccl` one, then
torch.cuda.synchronize()), timed on the host. Iterations per size
= clamp(--budget / size, --min-iters, -n). time = mean per op, max over ranks. After timing, each peer
reduces a known pattern and rank 0 checks it; a wrong element exits 1. Rank 0 prints the table:
size, ddl.torch us (hvd.allreduce_, blocking), async us (hvd.allreduce_async_ + hvd.synchronize),
ddl-backend us, torch-nccl us, and ddl.torch's and the backend's over torch's (below 1: ddl faster)."""
import argparse
import sys
import time

import torch
import torch.distributed as dist

import ddl.distributed  # noqa: F401  (registers the torch.distributed backend "ddl")
import ddl.torch as hvd


def size_arg(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    mult = units.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-b", type=size_arg, default=4, help="smallest size in bytes (default 4)")
    p.add_argument("-e", type=size_arg, default=64 << 20, help="largest size in bytes (default 64M)")
    p.add_argument("-w", type=int, default=20, help="warm-up iterations (default 20)")
    p.add_argument("-n", type=int, default=1000, help="most timed iterations per size (default 1000)")
    p.add_argument("--min-iters", type=int, default=20)
    p.add_argument("--budget", type=size_arg, default=4 << 30, help="bytes to move per size (default 4G)")
    return p.parse_args()


def timed(op, iters, warmup):
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    elapsed = (time.perf_counter() - start) / iters
    worst = torch.tensor([elapsed], dtype=torch.float64, device="cuda")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def wrong_elements(reduce, n, rank, size, device):
    buf = (torch.arange(n, device=device) % 8).float() + (rank + 1)
    reduce(buf)
    torch.cuda.synchronize()
    expected = (torch.arange(n, device=device) % 8).float() * size + size * (size + 1) / 2
    return int((buf != expected).sum().item())


def main():
    args = parse()
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    rank, size = dist.get_rank(), dist.get_world_size()
    ddl_group = dist.new_group(backend="ddl")
    device = torch.device("cuda", torch.cuda.current_device())
    buffer = torch.zeros(max(args.e // 4, 1), device=device)

    def with_ddl(t):
        hvd.allreduce_(t, op=hvd.Sum, name=f"bench.{t.numel()}")

    def with_ddl_async(t):
        hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Sum, name=f"bench.async.{t.numel()}"))

    def with_ddl_backend(t):
        dist.all_reduce(t, group=ddl_group)
        torch.cuda.synchronize()

    def with_torch(t):
        dist.all_reduce(t)
        torch.cuda.synchronize()

    if rank == 0:
        print(f"# ddl.torch vs torch.distributed nccl, {size} ranks, float32 sum in place, "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
        print(f"{'bytes':>12} {'iters':>6} {'ddl_us':>10} {'async_us':>10} {'backend_us':>10} {'torch_us':>10} "
              f"{'ddl/torch':>9} {'backend/torch':>13}")
    wrong = 0
    nbytes = args.b
    while nbytes <= args.e:
        n = max(nbytes // 4, 1)
        t = buffer[:n]
        iters = max(args.min_iters, min(args.n, args.budget // max(nbytes, 1)))
        warmup = min(args.w, iters)
        ddl_s = timed(lambda: with_ddl(t), iters, warmup)
        async_s = timed(lambda: with_ddl_async(t), iters, warmup)
        backend_s = timed(lambda: with_ddl_backend(t), iters, warmup)
        torch_s = timed(lambda: with_torch(t), iters, warmup)
        wrong += sum(wrong_elements(reduce, n, rank, size, device)
                     for reduce in (with_ddl, with_ddl_async, with_ddl_backend, with_torch))
        if rank == 0:
            print(f"{n * 4:>12} {iters:>6} {ddl_s * 1e6:>10.1f} {async_s * 1e6:>10.1f} {backend_s * 1e6:>10.1f} "
                  f"{torch_s * 1e6:>10.1f} "
                  f"{ddl_s / torch_s:>9.2f} {backend_s / torch_s:>13.2f}", flush=True)
        nbytes *= 2
    dist.destroy_process_group()
    hvd.shutdown()
    if wrong:
        print(f"rank {rank}: {wrong} wrong elements", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
