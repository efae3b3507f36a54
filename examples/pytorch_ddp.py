"""Data-parallel training with PyTorch DistributedDataParallel on CPU (gloo).

Run it with ddl, which starts the workers and gives each one torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...):

    ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py
    ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py --epochs 10
    ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py --backend ddl   # on libddl

What it does:

1. Joins the process group with init_process_group("gloo"), env:// style (or "ddl",
   libddl's torch.distributed backend, with --backend ddl).
2. Checks an all-reduce: every rank sums the float64 tensor
   [rank+1, 10*(rank+1)] and compares the result with the sum worked out by
   hand, W(W+1)/2 and ten times that; a mismatch ends the run with exit 1.
3. Trains a small MLP on a synthetic regression task (targets come from a
   fixed random "teacher" network, the same on every rank). Each rank draws
   its own shard of inputs, seeded by its rank. Rank 0 prints the loss per
   epoch, averaged over all ranks.
4. Checks that the replicas stayed identical: every rank hashes its
   parameters with SHA-256 and rank 0 compares the digests (exit 1 if not).

Needs no GPU, no downloads, and takes a few seconds with 4 workers.
"""

import argparse
import gc
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES = 16
HIDDEN = 64
TEACHER_SEED = 1234
MODEL_SEED = 0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples-per-rank", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend: gloo or ddl")
    return parser.parse_args()


def log0(message):
    """Print on rank 0 only."""
    if dist.get_rank() == 0:
        print(message, flush=True)


def allreduce_check():
    """All-reduce [rank+1, 10*(rank+1)], compare with the sum done by hand.

    Returns an error message, or None when the result is right.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    got = tensor.tolist()
    total = world * (world + 1) // 2  # sum of r+1 for r in 0..W-1
    expected = [float(total), float(10 * total)]
    ok = got == expected
    print(f"allreduce check: rank {rank} world {world} "
          f"got [{got[0]:g}, {got[1]:g}] expected [{expected[0]:g}, {expected[1]:g}] "
          f"{'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        return f"all-reduce on rank {rank} returned {got}, expected {expected}"
    return None


def make_mlp():
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
        nn.Linear(HIDDEN, 1),
    )


def make_teacher():
    """A fixed random network, the same on every rank, scaled to unit output."""
    torch.manual_seed(TEACHER_SEED)
    teacher = make_mlp()
    with torch.no_grad():
        probe = teacher(torch.randn(4096, IN_FEATURES))
        last = teacher[-1]
        last.bias -= probe.mean()
        last.weight /= probe.std()
        last.bias /= probe.std()
    return teacher


def make_shard(rank, samples):
    """This rank's inputs (seeded by rank) and the teacher's targets for them."""
    teacher = make_teacher()
    generator = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(samples, IN_FEATURES, generator=generator)
    with torch.no_grad():
        y = teacher(x) + 0.05 * torch.randn(samples, 1, generator=generator)
    return x, y


def mean_over_ranks(value):
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.item() / dist.get_world_size()


def train_epoch(model, optimizer, x, y, batch_size, epoch):
    """One pass over this rank's shard; returns the mean loss of its batches."""
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(epoch * 100003 + dist.get_rank())
    order = torch.randperm(len(x), generator=generator)
    total, batches = 0.0, 0
    for start in range(0, len(x), batch_size):
        index = order[start:start + batch_size]
        optimizer.zero_grad()
        loss = loss_fn(model(x[index]), y[index])
        loss.backward()  # DDP averages the gradients over all ranks here
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / batches


def params_digest(model):
    sha = hashlib.sha256()
    for param in model.parameters():
        sha.update(param.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()


def replicas_check(model):
    """Compare the SHA-256 of every rank's parameters on rank 0.

    Returns an error message on rank 0 when they differ, else None.
    """
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, params_digest(model))
    if dist.get_rank() != 0:
        return None
    if len(set(digests)) == 1:
        print(f"replicas identical: yes (sha256 {digests[0][:16]})", flush=True)
        return None
    listing = "\n".join(f"  rank {r}: {d}" for r, d in enumerate(digests))
    print(f"replicas identical: NO\n{listing}", flush=True)
    return "the model replicas differ after training"


def train(args):
    """Train the DDP model; returns replicas_check's verdict.

    The model lives only inside this function, so its DDP Reducer is gone
    before main() destroys the process group (see main).
    """
    torch.manual_seed(MODEL_SEED)  # DDP also broadcasts rank 0's weights
    model = DDP(make_mlp())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x, y = make_shard(dist.get_rank(), args.samples_per_rank)
    for epoch in range(1, args.epochs + 1):
        loss = mean_over_ranks(train_epoch(model, optimizer, x, y, args.batch_size, epoch))
        log0(f"epoch {epoch}/{args.epochs} loss {loss:.6f}")
    return replicas_check(model)


def main():
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.backend == "ddl":
        import ddl.distributed  # noqa: F401  (registers the "ddl" backend)
    dist.init_process_group(args.backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    log0(f"world size {dist.get_world_size()}, backend {dist.get_backend()}, "
         f"torch {torch.__version__}, epochs {args.epochs}")

    error = allreduce_check()
    if error is None:
        error = train(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr, flush=True)

    # Order matters with torch 1.13: if the DDP Reducer held the last reference
    # to the gloo process group, its destructor would join gloo's worker
    # threads while holding the GIL, and a worker that needs the GIL to free a
    # tensor would deadlock the exit. So the model is freed first (train() has
    # returned; collect any cycles), then destroy_process_group drops the group.
    gc.collect()
    dist.destroy_process_group()
    if error is not None:
        sys.exit(1)


if __name__ == "__main__":
    main()
