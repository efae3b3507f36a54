"""The torch.distributed `ddl` backend on CUDA tensors (libddl's NCCL path), one rank per GPU: the
`gpu.torch_backend` test. Started plainly, it starts itself under `ddl run -np <GPUs>` ($DDL_BIN,
default build/cli/ddl); it exits 77 (ctest: skipped) with a message when no GPU is visible.

Each check prints "ok NAME" or "FAIL NAME: why". Expected values are computed on the CPU from every
rank's inputs, which each rank rebuilds from the rank number; where torch has its own NCCL backend,
the same ops on a `nccl` group must agree too. Every result must stay on its GPU.

DDL_CHECKS_DEVICE=cpu runs the same checks on host tensors (torch 1.13 here, where no GPU is): a check
of the checks themselves, not of the CUDA path, and not a ctest test."""
import contextlib
import datetime
import os
import sys

import torch

ON_CPU = os.environ.get("DDL_CHECKS_DEVICE") == "cpu"
if not ON_CPU and not torch.cuda.is_available():
    print("SKIPPED: no CUDA GPU visible to PyTorch; the gpu-labelled tests need one", flush=True)
    sys.exit(77)

if "DDL_RANK" not in os.environ:  # the test's driver: one worker per GPU
    here = os.path.dirname(os.path.abspath(__file__))
    ddl_bin = os.environ.get("DDL_BIN", os.path.join(here, "..", "..", "build", "cli", "ddl"))
    workers = 2 if ON_CPU else torch.cuda.device_count()
    os.execv(ddl_bin, [ddl_bin, "run", "-np", str(workers), "--", sys.executable, os.path.abspath(__file__)])

import torch.distributed as dist  # noqa: E402

import ddl.distributed  # noqa: E402,F401  (registers the backend)
import worker_checks  # noqa: E402
from worker_checks import failures  # noqa: E402

if ON_CPU:
    DEVICE = torch.device("cpu")
else:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    DEVICE = torch.device("cuda", torch.cuda.current_device())

dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=120))
R, N = dist.get_rank(), dist.get_world_size()
# torch's own NCCL backend beside it, on the same store: the reference a user would compare against.
NCCL = dist.new_group(backend="nccl") if not ON_CPU and dist.is_nccl_available() else None

all_gather_into_tensor = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base  # torch 1.13: the latter
reduce_scatter_tensor = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base


def check(name):
    return worker_checks.check(name, after=None if ON_CPU else torch.cuda.synchronize)


def data(rank, shape=(3, 4), dtype=torch.float32, seed=0):
    """Rank `rank`'s input, on the CPU: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(1, 5, shape, generator=g).to(dtype)


def on_device(result, expected):
    assert result.device == DEVICE, f"result on {result.device}, not {DEVICE}"
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert torch.equal(result.cpu(), expected), f"{result.cpu()} != {expected}"


@check("the default group is ddl's, and on torch 2.x it is registered for CUDA")
def _():
    assert dist.get_backend() == "ddl", dist.get_backend()
    capability = getattr(dist.Backend, "backend_capability", None)  # torch >= 2.2
    if capability is not None and not ON_CPU:
        assert "cuda" in capability.get("ddl", []), capability.get("ddl")


@check("all_reduce SUM/MIN/MAX/PRODUCT/AVG of float32, float16, bfloat16 and int64")
def _():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        inputs = [data(r, dtype=dtype) for r in range(N)]
        stacked = torch.stack([t.double() for t in inputs])
        expected = {"SUM": stacked.sum(0), "MIN": stacked.min(0).values, "MAX": stacked.max(0).values,
                    "PRODUCT": stacked.prod(0)}
        if dtype.is_floating_point:
            expected["AVG"] = stacked.mean(0)
        for op, value in expected.items():
            t = inputs[R].clone().to(DEVICE)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            if op == "AVG":  # a mean of small integers: exact in float32, rounded once in 16 bits
                assert torch.allclose(t.cpu().double(), value, rtol=1e-2), (op, dtype, t.cpu(), value)
                assert t.device == DEVICE and t.dtype == dtype
            else:
                on_device(t, value.to(dtype))


@check("an all_reduce is ordered after the kernel that wrote its tensor, on the current stream")
def _():
    x = torch.arange(1 << 20, device=DEVICE, dtype=torch.float32)
    x.mul_(R + 1)  # queued on the current stream, unfinished when the op is submitted
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    on_device(x, torch.arange(1 << 20, dtype=torch.float32) * (N * (N + 1) // 2))


@check("all_reduce and all_gather on a side stream, and get_future()'s value")
def _():
    side = None if ON_CPU else torch.cuda.Stream(device=DEVICE)
    ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
    with ctx:
        x = torch.full((1000,), float(R + 1), device=DEVICE)
        work = dist.all_reduce(x, async_op=True)
        fut = work.get_future()
        got = fut.wait()
        # all_gather's results are copied out after the collective: on this stream too, so that the
        # kernel below, queued at once on it, reads them whole.
        parts = [torch.empty(1 << 20, device=DEVICE) for _ in range(N)]
        dist.all_gather(parts, torch.full((1 << 20,), float(R), device=DEVICE), async_op=True).wait()
        sums = torch.stack([p.sum() for p in parts])
    if side is not None:
        side.synchronize()
    result = got[0] if isinstance(got, (list, tuple)) else got
    on_device(result, torch.full((1000,), float(N * (N + 1) // 2)))
    on_device(sums, torch.tensor([float(r * (1 << 20)) for r in range(N)]))


@check("all_gather started on a side stream, waited for on the default one")
def _():
    side = None if ON_CPU else torch.cuda.Stream(device=DEVICE)
    ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
    parts = [torch.empty(1 << 24, device=DEVICE) for _ in range(N)]
    with ctx:
        work = dist.all_gather(parts, torch.full((1 << 24,), float(R), device=DEVICE), async_op=True)
        if side is not None:
            torch.cuda._sleep(100_000_000)  # the side stream stays busy: its copies out come late
    # Work.wait() makes this (the default) stream wait for the side stream's copies into `parts`.
    work.wait()
    sums = torch.stack([p.sum() for p in parts])
    on_device(sums, torch.tensor([float(r * (1 << 24)) for r in range(N)]))


@check("broadcast from the last rank, and reduce to rank 0")
def _():
    inputs = [data(r, shape=(6,), dtype=torch.int64) for r in range(N)]
    t = inputs[R].clone().to(DEVICE)
    dist.broadcast(t, src=N - 1)
    on_device(t, inputs[N - 1])
    t = inputs[R].clone().to(DEVICE)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    if R == 0:
        on_device(t, torch.stack(inputs).sum(0))


@check("all_gather, all_gather_into_tensor and reduce_scatter_tensor")
def _():
    inputs = [data(r, shape=(2, 3), dtype=torch.float16) for r in range(N)]
    outputs = [torch.empty(2, 3, dtype=torch.float16, device=DEVICE) for _ in range(N)]
    dist.all_gather(outputs, inputs[R].clone().to(DEVICE))
    for r in range(N):
        on_device(outputs[r], inputs[r])
    out = torch.empty(2 * N, 3, dtype=torch.float16, device=DEVICE)
    all_gather_into_tensor(out, inputs[R].clone().to(DEVICE))
    on_device(out, torch.cat(inputs))
    full = [data(r, shape=(2 * N, 3), seed=3) for r in range(N)]
    piece = torch.empty(2, 3, device=DEVICE)
    reduce_scatter_tensor(piece, full[R].clone().to(DEVICE))
    on_device(piece, torch.stack(full).sum(0)[2 * R:2 * R + 2])


@check("all_to_all_single with splits that differ by rank, and barrier")
def _():
    # Rank r sends (d + 1) rows to rank d, each row filled with 100*r + d.
    send = torch.cat([torch.full((d + 1, 2), 100.0 * R + d) for d in range(N)]).clone().to(DEVICE)
    recv = torch.empty((R + 1) * N, 2, device=DEVICE)
    dist.all_to_all_single(recv, send, output_split_sizes=[R + 1] * N, input_split_sizes=[d + 1 for d in range(N)])
    on_device(recv, torch.cat([torch.full((R + 1, 2), 100.0 * r + R) for r in range(N)]))
    dist.barrier()


@check("the same ops on torch's own nccl group agree with ddl's")
def _():
    if NCCL is None:
        print("  (no nccl group here: compared with the expected values only)", flush=True)
        return
    g = torch.Generator().manual_seed(R)
    x = torch.randn(1 << 16, generator=g).clone().to(DEVICE)
    ours, theirs = x.clone(), x.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=NCCL)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (ours - theirs).abs().max()
    ours, theirs = x.clone(), x.clone()
    dist.all_reduce(ours, op=dist.ReduceOp.AVG)
    dist.all_reduce(theirs, op=dist.ReduceOp.AVG, group=NCCL)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (ours - theirs).abs().max()


@check("DDP on the device with backend ddl keeps the replicas identical and learns")
def _():
    torch.manual_seed(1234 + R)  # different starting weights on purpose: DDP broadcasts rank 0's
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(DEVICE)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=None if ON_CPU else [DEVICE.index],
                                                      bucket_cap_mb=0.01)  # several buckets, overlapping backward
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(R)
    target = torch.randn(64, 4, generator=torch.Generator().manual_seed(99)).clone().to(DEVICE)
    losses = []
    for _ in range(30):
        x = torch.randn(64, 16, generator=g).clone().to(DEVICE)
        loss = (model(x) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(replicas, flat)
    assert all(torch.equal(replicas[0], replicas[r]) for r in range(N)), "replicas differ after training"
    assert losses[-1] < losses[0], losses


dist.destroy_process_group()
print(f"{'PASS' if not failures else 'FAIL'} rank {R} of {N}: {len(failures)} failed", flush=True)
sys.exit(1 if failures else 0)
