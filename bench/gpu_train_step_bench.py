"""A training step on the GPU: the plain step, DDP over NCCL, DDP on the `ddl` backend and ddl.torch's
DistributedOptimizer, in one process, on the same model and batch, taking turns. One worker per GPU:

    ddl run -np <GPUs> -- python3 bench/gpu_train_step_bench.py [--rounds 5] [--steps 30]
    ddl run --cpu -np 2 -- /usr/bin/python3 bench/gpu_train_step_bench.py --device cpu   # a dry run (gloo for nccl)

Two models (--model picks one or both):
    many   25 blocks of Linear(256, 256) + LayerNorm(256): 100 gradient tensors of mixed sizes
    large  4 x Linear(2048, 2048): 8 gradient tensors, 64 MB of float32 gradients
A step is zero_grad, forward on --batch rows, an MSE loss, backward and SGD (momentum 0.9). Variants:
    plain      the model alone, no communication (the floor)
    ddp-nccl   DistributedDataParallel on the default nccl group (gloo with --device cpu)
    ddp-ddl    the same DDP on a `ddl` group (libddl)
    ddl.torch  ddl.torch.DistributedOptimizer (libddl, named gradients, fused)
Each round runs every variant for --steps steps after --warmup, in turn, and times each step on the
host (after a device synchronize); a step's time is the slowest rank's. The table gives, per model and
variant, the median and fastest of the rounds' median step times in ms and the ratio of the median to
the plain step's and to DDP over NCCL's. Every rank trains on the same batch, so every variant's
weights must equal the plain step's at the end (checked; a difference exits 1)."""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ddl.torch as hvd


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--model", choices=("many", "large", "both"), default="both")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    return p.parse_args()


def model_of(kind, device):
    torch.manual_seed(7)
    if kind == "many":
        blocks = [torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)) for _ in range(25)]
        width = 256
    else:
        blocks = [torch.nn.Linear(2048, 2048) for _ in range(4)]
        width = 2048
    return torch.nn.Sequential(*blocks).to(device), width


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Variant:
    def __init__(self, name, model, optimizer):
        self.name, self.model, self.optimizer = name, model, optimizer
        self.rounds = []  # each round's median step, seconds

    def step(self, x, y):
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()


def variants_for(kind, device, ddl_group):
    made = []
    for name in ("plain", "ddp-nccl", "ddp-ddl", "ddl.torch"):
        model, width = model_of(kind, device)
        if name == "ddp-nccl":
            model = torch.nn.parallel.DistributedDataParallel(model)
        elif name == "ddp-ddl":
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=ddl_group)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if name == "ddl.torch":
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=[(f"{kind}.{n}", p) for n, p in model.named_parameters()])
        made.append(Variant(name, model, optimizer))
    return made, width


def slowest(seconds, device):
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def run_round(variant, x, y, args, device):
    for _ in range(args.warmup):
        variant.step(x, y)
    synchronize(device)
    steps = []
    for _ in range(args.steps):
        start = time.perf_counter()
        variant.step(x, y)
        synchronize(device)
        steps.append(time.perf_counter() - start)
    variant.rounds.append(slowest(statistics.median(steps), device))


def weights(model):
    inner = model.module if hasattr(model, "module") else model
    return torch.cat([p.detach().flatten() for p in inner.parameters()])


def main():
    args = parse()
    hvd.init()
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
        where = f"{torch.cuda.get_device_name()}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        where = "CPU, gloo for nccl"
    ddl_group = dist.new_group(backend="ddl")
    rank, size = dist.get_rank(), dist.get_world_size()
    kinds = ("many", "large") if args.model == "both" else (args.model,)
    if rank == 0:
        print(f"# training step, {size} rank(s), {where}, torch {torch.__version__}; "
              f"{args.rounds} rounds x {args.steps} steps, batch {args.batch}")
        print(f"{'model':>6} {'variant':>10} {'median_ms':>10} {'fastest_ms':>10} {'/plain':>7} {'/ddp-nccl':>9}")
    differ = 0
    for kind in kinds:
        variants, width = variants_for(kind, device, ddl_group)
        g = torch.Generator().manual_seed(11)
        x = torch.randn(args.batch, width, generator=g).to(device)
        y = torch.randn(args.batch, width, generator=g).to(device)
        for _ in range(args.rounds):
            for v in variants:
                run_round(v, x, y, args, device)
        plain = statistics.median(variants[0].rounds)
        ddp = statistics.median(variants[1].rounds)
        reference = weights(variants[0].model)
        for v in variants:
            median = statistics.median(v.rounds)
            if rank == 0:
                print(f"{kind:>6} {v.name:>10} {median * 1e3:>10.2f} {min(v.rounds) * 1e3:>10.2f} "
                      f"{median / plain:>7.2f} {median / ddp:>9.2f}", flush=True)
            if not torch.allclose(weights(v.model), reference, rtol=1e-4, atol=1e-5):
                differ += 1
                print(f"rank {rank}: {kind} {v.name}: weights differ from the plain step's by "
                      f"{(weights(v.model) - reference).abs().max().item()}", file=sys.stderr)
    dist.destroy_process_group()
    hvd.shutdown()
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
