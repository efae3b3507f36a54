"""ddl.torch on CUDA tensors, one rank per GPU (libddl's NCCL path): the `gpu.ddl_torch` test.
Started plainly, it starts itself under `ddl run -np <GPUs>` ($DDL_BIN, default build/cli/ddl);
with DDL_GPU_CHECK_RANKS=N beyond the GPUs, under `ddl run -np N --share-gpus`, where CUDA ops go
through host memory (the gpu.ddl_torch_shared_gpu_* tests). It exits 77 (ctest: skipped) with a
message when no GPU is visible.

Each check prints "ok NAME" or "FAIL NAME: why"; expected values are computed on the CPU from every
rank's inputs, which each rank rebuilds from the rank number. Every result must stay on the GPU."""
import os
import sys

import torch

if not torch.cuda.is_available():
    print("SKIPPED: no CUDA GPU visible to PyTorch; the gpu-labelled tests need one", flush=True)
    sys.exit(77)

if "DDL_RANK" not in os.environ:  # the test's driver: one worker per GPU
    here = os.path.dirname(os.path.abspath(__file__))
    ddl = os.environ.get("DDL_BIN", os.path.join(here, "..", "..", "build", "cli", "ddl"))
    ranks = int(os.environ.get("DDL_GPU_CHECK_RANKS", torch.cuda.device_count()))
    share = ["--share-gpus"] if ranks > torch.cuda.device_count() else []
    os.execv(ddl, [ddl, "run", "-np", str(ranks), *share, "--", sys.executable, os.path.abspath(__file__)])

import ddl.torch as hvd  # noqa: E402
import worker_checks  # noqa: E402
from worker_checks import failures  # noqa: E402


def check(name):
    return worker_checks.check(name, after=torch.cuda.synchronize)


hvd.init()
R, N = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
GPU = torch.device("cuda", torch.cuda.current_device())


def data(rank, shape=(3, 4), dtype=torch.float32, seed=0):
    """Rank `rank`'s input, on the CPU: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(1, 5, shape, generator=g).to(dtype)


def on_gpu(result, expected):
    assert result.device == GPU, f"result on {result.device}, not {GPU}"
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert torch.equal(result.cpu(), expected), f"{result.cpu()} != {expected}"


@check("the build reports NCCL and CUDA")
def _():
    assert hvd.nccl_built() and hvd.cuda_built(), (hvd.nccl_built(), hvd.cuda_built())


@check("allreduce Sum/Min/Max/Product of every dtype NCCL reduces, and int16 through int32")
def _():
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64):
        inputs = [data(r, dtype=dtype) for r in range(N)]
        stacked = torch.stack([t.double() for t in inputs])
        for op, reduce in ((hvd.Sum, stacked.sum(0)), (hvd.Min, stacked.min(0).values),
                           (hvd.Max, stacked.max(0).values), (hvd.Product, stacked.prod(0))):
            result = hvd.allreduce(inputs[R].to(GPU), op=op, name=f"ar.{dtype}.{op}")
            on_gpu(result, reduce.to(dtype))


@check("allreduce Average, and prescale/postscale on floats and integers")
def _():
    inputs = [data(r) for r in range(N)]
    mean = torch.stack(inputs).mean(0)
    on_gpu(hvd.allreduce(inputs[R].to(GPU), name="avg"), mean)
    total = torch.stack(inputs).sum(0)
    on_gpu(hvd.allreduce(inputs[R].to(GPU), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scaled"),
           total)
    ints = [data(r, dtype=torch.int32) for r in range(N)]
    on_gpu(hvd.allreduce(ints[R].to(GPU), op=hvd.Sum, prescale_factor=3.0, name="scaled.int"),
           (torch.stack(ints).sum(0) * 3).to(torch.int32))
    halves = [data(r, dtype=torch.float16) for r in range(N)]
    on_gpu(hvd.allreduce(halves[R].to(GPU), op=hvd.Sum, postscale_factor=0.25, name="scaled.half"),
           (torch.stack(halves).float().sum(0) * 0.25).half())
    # An integer Average with a postscale is a Sum scaled once by postscale / N, as on the host
    # (averaged first it was rounded twice: 1 + 2 over 2 ranks scaled by 3 gave 3, not 4).
    host = hvd.allreduce(ints[R], op=hvd.Average, postscale_factor=3.0, name="avg.post.int.host")
    on_gpu(hvd.allreduce(ints[R].to(GPU), op=hvd.Average, postscale_factor=3.0, name="avg.post.int"), host)
    rows = [data(r, shape=(2 * N, 3), dtype=torch.int32) for r in range(N)]
    host = hvd.reducescatter(rows[R], op=hvd.Average, postscale_factor=3.0, name="rs.avg.post.int.host")
    on_gpu(hvd.reducescatter(rows[R].to(GPU), op=hvd.Average, postscale_factor=3.0, name="rs.avg.post.int"), host)


@check("out-of-place Average of odd counts writes every element")
def _():
    for dtype, n in ((torch.float32, 4913), (torch.float32, 4097), (torch.float64, 5000), (torch.float64, 65537)):
        inputs = [data(r, shape=(n,), dtype=dtype, seed=3) for r in range(N)]
        on_gpu(hvd.allreduce(inputs[R].to(GPU), op=hvd.Average, name=f"avg.{dtype}.{n}"), torch.stack(inputs).mean(0))


@check("scaled temporaries live until the op ran: many scaled ops in flight, then the allocator churns")
def _():
    inputs = [data(r, shape=(1 << 16,), seed=7) for r in range(N)]
    handles = [hvd.allreduce_async(inputs[R].to(GPU), op=hvd.Sum, prescale_factor=2.0, name=f"churn.{i}")
               for i in range(16)]
    garbage = [torch.full((1 << 16,), -1e9, device=GPU) for _ in range(64)]  # reuses freed blocks
    expected = torch.stack(inputs).sum(0) * 2
    for h in handles:
        on_gpu(hvd.synchronize(h), expected)
    del garbage


@check("in-place allreduce_ of a tensor a kernel just wrote on the current stream")
def _():
    x = torch.arange(1 << 20, device=GPU, dtype=torch.float32)
    x.mul_(R + 1)  # queued on the current stream, unfinished when the op is submitted
    hvd.allreduce_(x, op=hvd.Sum, name="inplace")
    on_gpu(x, torch.arange(1 << 20, dtype=torch.float32) * (N * (N + 1) // 2))


@check("async ops submitted in a different order on each rank complete")
def _():
    names = [f"order.{i}" for i in range(8)]
    order = names if R % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.full((5,), float(R + names.index(n)), device=GPU), op=hvd.Sum, name=n)
               for n in order}
    for i, n in enumerate(names):
        on_gpu(hvd.synchronize(handles[n]), torch.full((5,), float(N * (N - 1) // 2 + N * i)))


@check("grouped_allreduce")
def _():
    groups = [[data(r, shape=(k + 1, 3), seed=k) for k in range(5)] for r in range(N)]
    results = hvd.grouped_allreduce([t.to(GPU) for t in groups[R]], op=hvd.Sum, name="grouped")
    for k, result in enumerate(results):
        on_gpu(result, torch.stack([groups[r][k] for r in range(N)]).sum(0))


@check("allgather with first dimensions that differ by rank")
def _():
    inputs = [data(r, shape=(r + 1, 4), dtype=torch.float16) for r in range(N)]
    on_gpu(hvd.allgather(inputs[R].to(GPU), name="gather"), torch.cat(inputs))


@check("broadcast and broadcast_ from the last rank")
def _():
    inputs = [data(r, shape=(6,), dtype=torch.int64) for r in range(N)]
    on_gpu(hvd.broadcast(inputs[R].to(GPU), root_rank=N - 1, name="bcast"), inputs[N - 1])
    x = inputs[R].to(GPU)
    hvd.broadcast_(x, root_rank=0, name="bcast_")
    on_gpu(x, inputs[0])


@check("alltoall with splits, and reducescatter")
def _():
    # Rank r sends (d + 1) rows to rank d, each row filled with 100*r + d.
    def send(r):
        return torch.cat([torch.full((d + 1, 2), 100.0 * r + d) for d in range(N)])
    splits = torch.tensor([d + 1 for d in range(N)])  # int64: Horovod would want int32
    got, received = hvd.alltoall(send(R).to(GPU), splits=splits, name="a2a")
    on_gpu(got, torch.cat([torch.full((R + 1, 2), 100.0 * r + R) for r in range(N)]))
    assert received.tolist() == [R + 1] * N, received
    inputs = [data(r, shape=(2 * N, 3)) for r in range(N)]
    total = torch.stack(inputs).sum(0)
    on_gpu(hvd.reducescatter(inputs[R].to(GPU), op=hvd.Sum, name="rs"), total[2 * R:2 * R + 2])
    # Equal blocks go through NCCL: Average, scaled, and several at once.
    got = hvd.reducescatter(inputs[R].to(GPU), op=hvd.Average, name="rs.avg", prescale_factor=2.0,
                            postscale_factor=0.5)
    assert got.device == GPU and got.dtype == torch.float32, (got.device, got.dtype)
    assert torch.allclose(got.cpu(), (total / N)[2 * R:2 * R + 2]), (got.cpu(), total / N)
    many = hvd.grouped_reducescatter([inputs[R].to(GPU), (inputs[R] * 3).to(GPU)], op=hvd.Sum, name="rs.group")
    on_gpu(many[0], total[2 * R:2 * R + 2])
    on_gpu(many[1], (total * 3)[2 * R:2 * R + 2])
    # Rows not a multiple of the ranks (with 2 ranks or more), and int16, reduce through the host.
    odd = [data(r, shape=(2 * N + 1, 3)) for r in range(N)]
    rows = [2 + (1 if r == 0 else 0) for r in range(N)]
    start = sum(rows[:R])
    on_gpu(hvd.reducescatter(odd[R].to(GPU), op=hvd.Sum, name="rs.odd"), torch.stack(odd).sum(0)[start:start + rows[R]])
    small = [data(r, shape=(2 * N, 3)).to(torch.int16) for r in range(N)]
    on_gpu(hvd.reducescatter(small[R].to(GPU), op=hvd.Sum, name="rs.int16"),
           torch.stack(small).sum(0).to(torch.int16)[2 * R:2 * R + 2])


@check("DistributedOptimizer on a CUDA model keeps the replicas identical")
def _():
    torch.manual_seed(1234 + R)  # different starting weights on purpose: broadcast must fix them
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(GPU)
    opt = torch.optim.SGD(net.parameters(), lr=0.05 * N, momentum=0.9)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    g = torch.Generator().manual_seed(R)
    for _ in range(20):
        x = torch.randn(8, 16, generator=g).to(GPU)
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    replicas = hvd.allgather(flat.unsqueeze(0), name="replicas")
    assert all(torch.equal(replicas[0], replicas[r]) for r in range(N)), "replicas differ after training"


@check("a step on each rank's share of a global batch gives the weights of one rank's step on all of it")
def _():
    def model():
        torch.manual_seed(99)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).double().to(GPU)

    g = torch.Generator().manual_seed(5)
    batch = torch.randn(24, 16, generator=g, dtype=torch.float64)  # 24 rows: equal shares for 1 to 4 ranks
    target = torch.randn(24, 4, generator=g, dtype=torch.float64)
    reference = model()  # what one rank computes on the whole batch
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=[(f"global_batch.{n}", p) for n, p in net.named_parameters()])
    rows = slice(R * 24 // N, (R + 1) * 24 // N)
    for _step in range(3):
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(batch.to(GPU)), target.to(GPU)).backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(batch[rows].to(GPU)), target[rows].to(GPU)).backward()
        opt.step()
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-12), f"{name} differs from one rank's step by {(p - q).abs().max().item()}"


hvd.shutdown()
print(f"{'PASS' if not failures else 'FAIL'} rank {R} of {N}: {len(failures)} failed", flush=True)
sys.exit(1 if failures else 0)
