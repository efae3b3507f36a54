"""PyTorch's mp.spawn tutorial pattern with backend "ddl" (argv: world size, then two free ports per
launched process: the launcher's rank K's world takes the pair K): collectives, a subgroup, DDP
training, destroy_process_group and init again, each rank printing what it got. No launcher: libddl's
world comes from torch's store. (Under a launcher, each launched process's workers make a world of
their own.)"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ddl.distributed  # noqa: F401  (registers the backend)


def say(rank, *what):
    sys.stdout.write(f"rank {rank}: " + " ".join(str(w) for w in what) + "\n")  # one write: the ranks share stdout
    sys.stdout.flush()


def train(rank, world_size, port, second_port, backend):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    say(rank, "world source", ddl.distributed._basics.world_source() if backend == "ddl" else "-")
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    say(rank, "all_reduce", t.tolist())
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([rank, rank * 10]))
    say(rank, "all_gather", [g.tolist() for g in gathered])
    b = torch.tensor([rank * 1.0])
    dist.broadcast(b, src=world_size - 1)
    say(rank, "broadcast", b.tolist())
    ends = [0, world_size - 1]  # a subgroup of the first and last rank
    group = dist.new_group(ends)
    if rank in ends:
        u = torch.tensor([float(rank)])
        dist.all_reduce(u, group=group)
        say(rank, "subgroup all_reduce", u.tolist())
    dist.barrier()
    del group  # a group kept alive keeps torch's store, and rank 0's port, with it
    dist.destroy_process_group()

    # Again, on another port: torch's store on the old one may still be closing.
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{second_port}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # a different batch on every rank
    for _ in range(5):
        optimizer.zero_grad()
        ddp(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.zeros_like(flat) for _ in range(world_size)]
    dist.all_gather(replicas, flat)
    say(rank, "replicas identical", all(torch.equal(r, replicas[0]) for r in replicas))
    dist.destroy_process_group()


if __name__ == "__main__":
    size, ports = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
    pair = 2 * int(os.environ.get("DDL_RANK", "0"))
    mp.spawn(train, args=(size, ports[pair], ports[pair + 1], "ddl"), nprocs=size)
