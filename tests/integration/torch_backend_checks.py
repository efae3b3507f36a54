"""Every torch.distributed collective on the "ddl" backend against gloo's result, run by
test_torch_backend.py under `ddl run -np N`. Prints "ok NAME" per check and "checks passed: N"."""

import datetime
import sys
import time
import warnings

import torch
import torch.distributed as dist

import ddl.distributed  # noqa: F401  (registers the backend)

passed = 0


def equal(a, b):
    """Integers and moved values exactly; floating-point sums up to their order of addition."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    return torch.equal(a, b)


def check(name, got, expected):
    global passed
    if isinstance(got, torch.Tensor):
        same = equal(got, expected)
    else:
        same = len(got) == len(expected) and all(equal(a, b) for a, b in zip(got, expected))
    if not same:
        print(f"FAIL {name}: ddl gave {got}, gloo {expected}", flush=True)
        sys.exit(1)
    passed += 1
    print(f"ok {name}", flush=True)


def both(fn):
    """fn(group) on the ddl world and on a gloo world; returns (ddl's, gloo's)."""
    return fn(DDL), fn(GLOO)


def data(seed, shape=(5, 3), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 10).to(dtype)


def reductions(rank):
    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
            if dtype == torch.uint8 and op in ("SUM", "PRODUCT"):
                continue  # overflow wraps alike, but gloo's uint8 product is not defined the same way
            def run(group, op=op, dtype=dtype):
                t = data(rank, dtype=dtype)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                return t
            check(f"all_reduce {op} {dtype}", *both(run))
    if hasattr(dist.ReduceOp, "AVG"):  # gloo has no AVG: its SUM, divided
        t = data(rank)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=DDL)
        expected = data(rank)
        dist.all_reduce(expected, group=GLOO)
        check("all_reduce AVG", t, expected / SIZE)
        # float16 as NCCL averages floats, each input premultiplied by 1/size: a sum first overflows.
        large = torch.full((3,), 60000.0, dtype=torch.float16)
        dist.all_reduce(large, op=dist.ReduceOp.AVG, group=DDL)
        check("all_reduce AVG float16 near its largest value", large, torch.full((3,), 60000.0, dtype=torch.float16))
        out = torch.zeros(2, dtype=torch.float16)
        scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base  # torch 1.13: the latter
        scatter(out, torch.full((2 * SIZE,), 60000.0, dtype=torch.float16), op=dist.ReduceOp.AVG, group=DDL)
        check("reduce_scatter_tensor AVG float16 near its largest value", out, torch.full((2,), 60000.0, dtype=torch.float16))
    try:
        dist.all_reduce(data(rank), op=dist.ReduceOp.BXOR, group=DDL)
    except ValueError as error:
        assert "BXOR" in str(error) and "gloo" in str(error), error
        check("all_reduce BXOR refused", torch.ones(1), torch.ones(1))
    else:
        print("FAIL all_reduce BXOR: no error", flush=True)
        sys.exit(1)

    def complex_sum(group):
        t = torch.complex(data(rank), data(rank + 10))
        dist.all_reduce(t, group=group)
        return t
    check("all_reduce complex SUM", *both(complex_sum))

    def reduce_to_1(group):
        t = data(rank)
        dist.reduce(t, dst=1 % SIZE, op=dist.ReduceOp.MAX, group=group)
        return t if RANK == 1 % SIZE else torch.zeros(1)  # torch leaves the others' tensors unspecified
    check("reduce MAX to rank 1", *both(reduce_to_1))

    # gloo has no reduce_scatter: its all_reduce, sliced, is the expected result.
    out = torch.zeros(4)
    dist.reduce_scatter(out, [data(rank * 100 + r, (4,)) for r in range(SIZE)], group=DDL)
    reduced = [data(rank * 100 + r, (4,)) for r in range(SIZE)]
    for t in reduced:
        dist.all_reduce(t, group=GLOO)
    check("reduce_scatter", out, reduced[RANK])
    if hasattr(dist, "reduce_scatter_tensor"):
        out = torch.zeros(2, 3)
        dist.reduce_scatter_tensor(out, data(rank, (2 * SIZE, 3)), group=DDL)
        full = data(rank, (2 * SIZE, 3))
        dist.all_reduce(full, group=GLOO)
        check("reduce_scatter_tensor", out, full[2 * RANK:2 * RANK + 2])
    else:  # torch 1.13: the private name the public one calls on 2.x
        out = torch.zeros(2, 3)
        dist._reduce_scatter_base(out, data(rank, (2 * SIZE, 3)), group=DDL)
        full = data(rank, (2 * SIZE, 3))
        dist.all_reduce(full, group=GLOO)
        check("_reduce_scatter_base", out, full[2 * RANK:2 * RANK + 2])


def moves(rank):
    def made(r, dtype):
        return data(r) > 5 if dtype == torch.bool else data(r).to(dtype)

    for dtype in (torch.float32, torch.int64, torch.float16, torch.bool, torch.complex64):
        t = made(rank, dtype)
        dist.broadcast(t, src=SIZE - 1, group=DDL)
        if dtype in (torch.bool, torch.complex64):  # which gloo does not move: the source's own tensor
            expected = made(SIZE - 1, dtype)
        else:
            expected = made(rank, dtype)
            dist.broadcast(expected, src=SIZE - 1, group=GLOO)
        check(f"broadcast {dtype}", t, expected)

    def all_gather(group):
        outs = [torch.zeros(2, 2, dtype=torch.int64) for _ in range(SIZE)]
        dist.all_gather(outs, data(rank, (2, 2), torch.int64), group=group)
        return outs
    check("all_gather", *both(all_gather))

    gather_into = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    out = torch.zeros(SIZE * 3)
    gather_into(out, data(rank, (3,)), group=DDL)
    expected = [torch.zeros(3) for _ in range(SIZE)]
    dist.all_gather(expected, data(rank, (3,)), group=GLOO)
    check("all_gather_into_tensor", out, torch.cat(expected))

    def all_to_all_single(group):
        out = torch.zeros(SIZE * 2)
        dist.all_to_all_single(out, data(rank, (SIZE * 2,)), group=group)
        return out
    check("all_to_all_single", *both(all_to_all_single))

    def all_to_all_uneven(group):
        in_splits = [r + 1 for r in range(SIZE)]          # rank r gets r+1 rows from every rank
        out_splits = [RANK + 1] * SIZE
        out = torch.zeros(sum(out_splits), 2)
        dist.all_to_all_single(out, data(rank, (sum(in_splits), 2)), out_splits, in_splits, group=group)
        return out
    check("all_to_all_single uneven splits", *both(all_to_all_uneven))

    ddl_out = [torch.zeros(3) for _ in range(SIZE)]
    dist.all_to_all(ddl_out, [data(rank * 10 + r, (3,)) for r in range(SIZE)], group=DDL)
    check("all_to_all", ddl_out, [data(r * 10 + RANK, (3,)) for r in range(SIZE)])

    def gather(group):
        outs = [torch.zeros(4) for _ in range(SIZE)] if RANK == 0 else None
        dist.gather(data(rank, (4,)), outs, dst=0, group=group)
        return outs if RANK == 0 else [torch.zeros(1)]
    check("gather", *both(gather))

    def scatter(group):
        out = torch.zeros(4)
        ins = [data(100 + r, (4,)) for r in range(SIZE)] if RANK == SIZE - 1 else None
        dist.scatter(out, ins, src=SIZE - 1, group=group)
        return out
    check("scatter", *both(scatter))

    objects = [None] * SIZE
    dist.all_gather_object(objects, {"rank": RANK, "tag": "x" * RANK}, group=DDL)
    check("all_gather_object", torch.tensor([o["rank"] for o in objects]), torch.arange(SIZE))
    listed = [f"from {RANK}", RANK] if RANK == 0 else [None, None]
    dist.broadcast_object_list(listed, src=0, group=DDL)
    check("broadcast_object_list", torch.tensor([listed[1]]), torch.tensor([0]))


def asynchronous(rank):
    works = [dist.all_reduce(data(rank + i), async_op=True, group=DDL) for i in range(20)]
    tensors = []
    for i, work in enumerate(works):
        work.wait()
        tensors.append(work.get_future().value()[0])
    expected = []
    for i in range(20):
        t = data(rank + i)
        dist.all_reduce(t, group=GLOO)
        expected.append(t)
    check("20 async all_reduce, Work.wait and get_future", tensors, expected)
    future = dist.all_reduce(data(rank), async_op=True, group=DDL).get_future().then(lambda f: f.value()[0] * 2)
    t = data(rank)
    dist.all_reduce(t, group=GLOO)
    check("get_future().then", future.wait(), t * 2)
    # A then-callback runs on the group's thread; one that waits for a later op's future (queued
    # behind on that thread) hung, and every later future of the group with it.
    first = dist.all_reduce(torch.ones(1), async_op=True, group=DDL).get_future()
    second = dist.all_reduce(torch.full((1,), 2.0), async_op=True, group=DDL).get_future()
    chained = first.then(lambda f: f.value()[0] + second.wait()[0])
    check("a then-callback waiting for a later op's future", chained.wait(), torch.full((1,), 3.0 * SIZE))
    check("a future after it", dist.all_reduce(torch.ones(1), async_op=True, group=DDL).get_future().wait()[0], torch.full((1,), float(SIZE)))
    dist.barrier(group=DDL)
    check("barrier", torch.ones(1), torch.ones(1))
    if SIZE > 1:  # rank 1's op waits for the others, which join only after its wait(timeout) gave up
        t = torch.full((3,), float(rank + 1))
        if rank == 1:
            work = dist.all_reduce(t, async_op=True, group=DDL)
            start = time.monotonic()
            expect_error(RuntimeError, "timed out after 200 ms", work.wait, timeout=datetime.timedelta(milliseconds=200))
            assert time.monotonic() - start < 30, "wait(timeout) waited for the group's timeout instead"
            dist.barrier(group=GLOO)
            work.wait()
        else:
            dist.barrier(group=GLOO)
            dist.all_reduce(t, group=DDL)
        check("Work.wait(timeout) raises while the op runs; a later wait completes it", t,
              torch.full((3,), float(SIZE * (SIZE + 1) // 2)))


def subgroups(rank):
    evens = list(range(0, SIZE, 2))
    # Every rank calls new_group, as torch requires; only members get a group.
    ddl_evens = dist.new_group(evens, backend="ddl")
    gloo_evens = dist.new_group(evens, backend="gloo")
    ddl_last = dist.new_group([SIZE - 1], backend="ddl")
    if RANK in evens:
        def run(group):
            t = data(rank)
            dist.all_reduce(t, group=group)
            dist.broadcast(t, src=evens[-1], group=group)  # a global rank, as torch takes it
            return t
        check("subgroup of even ranks: all_reduce, broadcast", run(ddl_evens), run(gloo_evens))
    if RANK == SIZE - 1:
        t = data(rank)
        dist.all_reduce(t, group=ddl_last)
        check("subgroup of one rank", t, data(rank))
    dist.barrier(group=DDL)


def torch2(rank):
    """What torch 2.x asks of a group besides the collectives: its name, destroying a subgroup, the
    coalescing manager and the functional collectives (torch 1.13 has none of these)."""
    if int(torch.__version__.split(".")[0]) < 2:
        print(f"torch {torch.__version__}: the torch 2.x checks do not apply", flush=True)
        return
    import torch.distributed._functional_collectives as functional
    check("the world's group has a name", torch.tensor(len(DDL.group_name) > 0), torch.tensor(True))
    pair = dist.new_group([0, 1], backend="ddl")
    if RANK in (0, 1):
        t = data(rank)
        dist.all_reduce(t, group=pair)
        check("a subgroup, then destroyed", t, data(0) + data(1))
        dist.destroy_process_group(pair)
    t = data(rank)
    expected = torch.cat([data(r) for r in range(SIZE)])
    gathered = torch.empty(SIZE * t.numel())
    with dist._coalescing_manager(group=DDL):
        dist.all_gather_into_tensor(gathered, t, group=DDL)
    check("all_gather_into_tensor under the coalescing manager", gathered, expected.flatten())
    check("functional all_gather_tensor", functional.wait_tensor(functional.all_gather_tensor(t, 0, DDL)), expected)
    full = torch.arange(SIZE * 3, dtype=torch.float32) * (rank + 1)
    reference = torch.empty(3)
    dist.reduce_scatter_tensor(reference, full.clone(), group=DDL)
    check("functional reduce_scatter_tensor",
          functional.wait_tensor(functional.reduce_scatter_tensor(full, "sum", 0, DDL)), reference)
    check("functional all_reduce", functional.wait_tensor(functional.all_reduce(t, "sum", DDL)),
          sum(data(r) for r in range(SIZE)))


def strided(rank):
    """Transposed, sliced and channels_last tensors get the results their contiguous copies get (the
    ddl backend reduces a contiguous copy and writes it back; gloo, which gets some slices wrong,
    runs on the copies here)."""
    layouts = {"transposed": lambda t: t.reshape(6, 4).t(), "sliced": lambda t: t.reshape(4, 6)[:, ::2],
               "channels_last": lambda t: t.reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)}
    for layout, make in layouts.items():
        def ddl_and_gloo(op):
            t = make(data(rank, shape=(24,)))
            assert not t.is_contiguous()
            expected = t.contiguous()
            op(t, DDL)
            op(expected, GLOO)
            return t, expected
        check(f"all_reduce of a {layout} tensor", *ddl_and_gloo(lambda t, g: dist.all_reduce(t, group=g)))
        check(f"broadcast of a {layout} tensor", *ddl_and_gloo(lambda t, g: dist.broadcast(t, src=SIZE - 1, group=g)))
        got, expected = ddl_and_gloo(lambda t, g: dist.reduce(t, dst=0, group=g))
        if rank == 0:
            check(f"reduce of a {layout} tensor", got, expected)
        source = [data(10 + r, shape=(24,)) for r in range(SIZE)]
        got = make(torch.zeros(24))
        dist.scatter(got, [make(t) for t in source] if rank == 0 else None, src=0, group=DDL)
        check(f"scatter into a {layout} tensor", got.contiguous().reshape(-1), make(source[rank]).contiguous().reshape(-1))
    # In-place results are not autograd's business, as with gloo: a reduced Parameter, a tensor with a history.
    param = torch.nn.Parameter(torch.full((3,), float(rank + 1)))
    dist.reduce(param, dst=0, group=DDL)
    check("reduce into a Parameter", param.detach(), torch.full((3,), float(SIZE * (SIZE + 1) // 2 if rank == 0 else rank + 1)))
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    dist.reduce(y, dst=0, group=DDL)
    y.sum().backward()
    check("reduce keeps the tensor's autograd history", x.grad, torch.full((3,), 2.0))


def expect_error(kind, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except kind as error:
        assert text in str(error), error
        return
    raise AssertionError(f"{fn.__name__} did not raise {kind.__name__}")


def errors(rank):
    expect_error(ValueError, "send/recv", dist.send, torch.ones(1), dst=(RANK + 1) % SIZE, group=DDL)
    check("send refused", torch.ones(1), torch.ones(1))
    # As gloo: outputs of the input's number of elements but another shape are refused.
    expect_error(ValueError, "output 0 has (2, 1)", dist.all_gather, [torch.zeros(2, 1) for _ in range(SIZE)], torch.ones(2),
                 group=DDL)
    check("all_gather into outputs of another shape refused", torch.ones(1), torch.ones(1))
    reduce_scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    expect_error(ValueError, "dtype", reduce_scatter, torch.zeros(2, dtype=torch.float64), torch.ones(2 * SIZE), group=DDL)
    check("reduce_scatter_tensor into another dtype refused", torch.ones(1), torch.ones(1))
    # all_reduce_multigpu / broadcast_multigpu with a list per rank returned each tensor reduced on its
    # own (and ignored src_tensor), where torch promises every tensor the sum of all of them.
    if hasattr(dist, "all_reduce_multigpu"):  # (gone from torch 2.x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "will be deprecated"
            expect_error(ValueError, "one tensor per rank", dist.all_reduce_multigpu, [torch.ones(1), torch.ones(1)], group=DDL)
            expect_error(ValueError, "one tensor per rank", dist.broadcast_multigpu, [torch.ones(1), torch.ones(1)], 0, group=DDL,
                         src_tensor=1)
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=DDL)  # the group is in step after the refusals
        check("all_reduce/broadcast_multigpu with two tensors per rank refused", t, torch.full((2,), float(SIZE * (SIZE + 1) // 2)))
    # A root outside the group was a silent no-op: nobody was the root.
    expect_error(ValueError, "invalid root rank", dist.reduce, torch.ones(2), SIZE + 5, group=DDL)
    check("reduce to a rank outside the group refused", torch.ones(1), torch.ones(1))
    # Each rank naming itself the root: a mismatch on every rank, not each its own "result". It puts
    # the group out of step (as gloo's timeout would), so it gets a group of its own.
    apart = dist.new_group(list(range(SIZE)), backend="ddl")
    if SIZE > 1:
        expect_error(RuntimeError, "reduce(dst=", dist.reduce, torch.ones(2), rank, group=apart)
        check("reduce with a different dst on each rank fails on every rank", torch.ones(1), torch.ones(1))
    # Only the root can check its list: it takes the op's place in the group's sequence with the
    # error, so every rank's gather fails with the root's reason (they waited for the timeout, and the
    # sequence stayed apart for good), and the next op pairs as it should.
    gather_list = [torch.zeros(2) for _ in range(SIZE)] if rank == 0 else None
    expect_error(ValueError, "gather_list", dist.gather, torch.ones(4), gather_list, dst=0, group=DDL)
    check("gather into a list of the wrong size fails on every rank", torch.ones(1), torch.ones(1))
    scatter_list = [torch.zeros(3) for _ in range(SIZE + 1)] if rank == 0 else None
    expect_error(ValueError, "scatter: the root takes", dist.scatter, torch.zeros(3), scatter_list, src=0, group=DDL)
    in_step = torch.full((2,), float(rank + 1))
    dist.all_reduce(in_step, group=DDL)
    check("the group's next op after the root's refusal pairs in step", in_step, torch.full((2,), float(SIZE * (SIZE + 1) / 2)))
    if SIZE > 1:  # bool and uint8 move alike, as bytes, but are not one type
        flags_or_bytes = torch.tensor([True, False]) if rank == 0 else torch.tensor([7, 200], dtype=torch.uint8)
        expect_error(RuntimeError, "differs between ranks", dist.broadcast, flags_or_bytes, 0, group=DDL)
        check("a broadcast of bools on one rank and bytes on another fails on every rank", torch.ones(1), torch.ones(1))
    if SIZE > 1:  # a check that fails on one rank only, before the op named itself: its place is still taken
        last = rank == SIZE - 1
        short = torch.zeros(SIZE * 2 - 1 if last else SIZE * 2)  # the last rank's output is one element short
        bad_calls = [
            ("all_reduce of a dtype the backend cannot reduce", ValueError,
             lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool) if last else torch.ones(2), group=DDL)),
            ("all_gather_into_tensor into too small an output", ValueError,
             lambda: dist.all_gather_into_tensor(short, torch.ones(2), group=DDL)),
            ("reduce to a root only one rank gets wrong", ValueError,
             lambda: dist.reduce(torch.ones(2), SIZE + 5 if last else 0, group=DDL)),
            ("a sparse all_reduce with a reduction only one rank gets wrong", ValueError,
             lambda: dist.all_reduce(torch.ones(2).to_sparse(), dist.ReduceOp.MAX if last else dist.ReduceOp.SUM, group=DDL)),
        ]
        for what, kind, call in bad_calls:
            try:
                call()
                raise AssertionError(f"{what}: no error")
            except kind as error:
                assert last or f"rank {SIZE - 1}: " in str(error) and "failed on" in str(error), (what, str(error))
            summed = torch.full((2,), 100.0 * (rank + 1))
            dist.all_reduce(summed, group=DDL)
            check(f"{what} on one rank fails on every rank; the next op pairs in step", summed,
                  torch.full((2,), 100.0 * SIZE * (SIZE + 1) / 2))
    if SIZE > 1:  # ranks that disagree on splits: every rank gets an error, none a half-written result
        out_splits = [1] * SIZE
        if rank == 0:
            out_splits[1] = 2  # rank 0 expects 2 elements from rank 1, which sends it 1
        out = torch.full((sum(out_splits),), -1.0)
        expect_error(Exception, "alltoallv", dist.all_to_all_single, out, torch.ones(SIZE), output_split_sizes=out_splits,
                     input_split_sizes=[1] * SIZE, group=DDL)
        check("all_to_all_single with splits that differ between ranks fails on every rank", out, torch.full_like(out, -1.0))
        # Splits that do not add up to rank 0's rows: only rank 0 can see it. It takes the op's place
        # with its error, so every rank fails at once with rank 0's reason (they waited for the
        # timeout, and the group's sequence stayed apart for good).
        in_splits = [1] * SIZE
        if rank == 0:
            in_splits[0] = 5
        out = torch.full((SIZE,), -1.0)
        expect_error(ValueError, "input_split_sizes", dist.all_to_all_single, out, torch.ones(SIZE),
                     output_split_sizes=[1] * SIZE, input_split_sizes=in_splits, group=DDL)
        check("all_to_all_single with splits only one rank has wrong fails on every rank", out, torch.full_like(out, -1.0))
        after = torch.ones(2)
        dist.all_reduce(after, group=DDL)
        check("the op after the failed one works", after, torch.full((2,), float(SIZE)))
        # A collective torch's C++ runs and waits for (DDP's parameter and buffer broadcast): torch
        # 1.13's C++ Work.wait() ignores a failure, so it must reach the caller another way.
        mismatched = torch.full((8 + rank,), float(rank + 1))
        expect_error(RuntimeError, "differs between ranks", dist._broadcast_coalesced, DDL, [mismatched], 1 << 20, 0)
        check("a failed broadcast torch's C++ waits for raises there", mismatched, torch.full((8 + rank,), float(rank + 1)))
        matched = torch.full((8,), float(rank + 1))
        dist._broadcast_coalesced(DDL, [matched], 1 << 20, 0)
        check("and one that works broadcasts", matched, torch.ones(8))


def sparse(rank):
    """SUM of sparse COO tensors, as gloo's: entries that differ in number by rank (none on rank 1),
    repeated indices, a dense part per entry; the result is written into the tensor."""
    def made(dtype):
        if rank == 1:
            return torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.int64), torch.zeros((0, 3), dtype=dtype), (4, 5, 3))
        entries = rank + 2
        indices = torch.tensor([[(rank + i) % 4 for i in range(entries)], [i % 5 for i in range(entries)]])
        indices[:, -1] = indices[:, 0]  # one index twice
        return torch.sparse_coo_tensor(indices, data(rank + 20, (entries, 3)).to(dtype), (4, 5, 3))

    for dtype in (torch.float32, torch.float64, torch.int64):
        def run(group, dtype=dtype):
            t = made(dtype)
            dist.all_reduce(t, group=group)
            assert t.is_sparse and t.is_coalesced(), t
            return t.to_dense()
        check(f"all_reduce of a sparse {dtype} tensor", *both(run))

    def asynchronously(group):
        t = made(torch.float32)
        dist.all_reduce(t, group=group, async_op=True).wait()
        return t.to_dense()
    check("all_reduce of a sparse tensor, async_op", *both(asynchronously))
    if SIZE > 1:  # polling waits for nobody: the other ranks submit only after rank 0 has polled
        t = made(torch.float32)
        polled = False
        if rank == 0:
            work = dist.all_reduce(t, group=DDL, async_op=True)
            polled = work.is_completed()
            dist.barrier(group=GLOO)
        else:
            dist.barrier(group=GLOO)
            work = dist.all_reduce(t, group=DDL, async_op=True)
        work.wait()
        check("a sparse all_reduce's is_completed() before the peers came", torch.tensor(polled), torch.tensor(False))
        check("and its result", t.to_dense(), asynchronously(GLOO))
        # Values libddl has no type for (bool) move as bytes: ranks that disagree on the dtype still fail together.
        dtype = torch.bool if rank == 0 else torch.uint8
        odd = torch.sparse_coo_tensor([[0]], torch.ones(1, dtype=dtype), (4,))
        expect_error(RuntimeError, "differs between ranks", dist.all_reduce, odd, group=DDL)
        after = torch.ones(2)
        dist.all_reduce(after, group=DDL)
        check("a sparse all_reduce of dtypes that differ by rank fails on every rank; the next op works", after,
              torch.full((2,), float(SIZE)))
    expect_error(ValueError, "SUM only", dist.all_reduce, made(torch.float32), op=dist.ReduceOp.MAX, group=DDL)
    check("all_reduce MAX of a sparse tensor refused", torch.ones(1), torch.ones(1))


def futures_and_aliases(rank):
    def expanded(group):  # one element shown three times: each shows the sum
        t = torch.tensor([float(rank + 1)]).expand(3)
        dist.all_reduce(t, group=group)
        return t.clone()
    check("all_reduce of an expanded tensor", *both(expanded))

    # The values of Work futures are gloo's: all_gather's and gather's the list of outputs.
    def gathered_future(group):
        outs = [torch.zeros(2) for _ in range(SIZE)]
        work = dist.all_gather(outs, torch.full((2,), float(rank)), group=group, async_op=True)
        work.wait()
        return work.get_future().value()
    check("all_gather's future value", *both(gathered_future))

    def gather_future(group):
        outs = [torch.zeros(2) for _ in range(SIZE)] if rank == 0 else None
        work = dist.gather(torch.full((2,), float(rank)), outs, dst=0, group=group, async_op=True)
        work.wait()
        return work.get_future().value()
    check("gather's future value", *both(gather_future))

    # all_reduce_coalesced of one tensor twice reduces it once (gloo reduces the list as one buffer).
    def twice(group):
        t = torch.arange(3.0) * (rank + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated
            dist.all_reduce_coalesced([t, t], group=group)
        return t
    check("all_reduce_coalesced of a tensor listed twice", *both(twice))

    def overlapping(group):  # views that share elements 2 and 3: those were reduced twice
        base = torch.arange(6.0) * (rank + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_reduce_coalesced([base[0:4], base[2:6]], group=group)
        return base
    check("all_reduce_coalesced of overlapping views", *both(overlapping))

    # Rank 0's list shares memory and the others' does not: each takes as many places of the group's
    # sequence, and the all_reduce after it pairs with the others' (it failed as a mismatch).
    def shared_on_one_rank(group):
        t = torch.arange(3.0) * (rank + 1)
        u = t if rank == 0 else t.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_reduce_coalesced([t, u], group=group)
        after = torch.full((2,), float(rank))
        dist.all_reduce(after, group=group)
        return [t, u, after]
    check("all_reduce_coalesced sharing memory on one rank only, then all_reduce", *both(shared_on_one_rank))

    # A barrier completes after the group's ops issued before it (gloo's and nccl's do): the
    # async all_reduce's tensor is written once barrier() returns, though this rank's came first.
    def barrier_after(group):
        t = torch.full((1 << 20,), float(rank + 1))
        if rank == 1:
            time.sleep(0.2)
        work = dist.all_reduce(t, async_op=True, group=group)
        dist.barrier(group=group)
        done = bool((t == SIZE * (SIZE + 1) / 2).all())
        work.wait()
        return torch.tensor([done])
    check("barrier after an async all_reduce: its result is in place", *both(barrier_after))

    # A list all_to_all where this rank sends nothing, of a dtype libddl moves as bytes.
    # (gloo has no list all_to_all: the expected blocks are written out.)
    inputs = [torch.full((0 if rank == 0 else 2,), complex(rank, r), dtype=torch.complex64) for r in range(SIZE)]
    outputs = [torch.zeros(0 if r == 0 else 2, dtype=torch.complex64) for r in range(SIZE)]
    dist.distributed_c10d._get_default_group().alltoall(outputs, inputs).wait()
    check("all_to_all of complex64 where rank 0 sends nothing", outputs,
          [torch.full((0 if r == 0 else 2,), complex(r, rank), dtype=torch.complex64) for r in range(SIZE)])

    # all_gather_coalesced: each rank's list, an empty tensor in it, complex numbers in another.
    def gathered_lists(dtype):
        def run(group):
            inputs = [data(rank + 7, (2, 3)).to(dtype), torch.zeros(0, dtype=dtype), torch.full((4,), rank + 1).to(dtype)]
            outputs = [[torch.empty_like(t) for t in inputs] for _ in range(dist.get_world_size(group))]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # all_gather_coalesced is deprecated
                dist.all_gather_coalesced(outputs, inputs, group=group)
            return [t for outs in outputs for t in outs]
        return run
    check("all_gather_coalesced of float32 lists", *both(gathered_lists(torch.float32)))
    check("all_gather_coalesced of complex64 lists", *both(gathered_lists(torch.complex64)))


if __name__ == "__main__":
    dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=60))
    RANK, SIZE = dist.get_rank(), dist.get_world_size()
    DDL = dist.group.WORLD
    GLOO = dist.new_group(list(range(SIZE)), backend="gloo")
    assert dist.get_backend() == "ddl", dist.get_backend()
    for part in (reductions, moves, asynchronous, subgroups, torch2, strided, errors, futures_and_aliases, sparse):
        part(RANK)
    print(f"checks passed: {passed}", flush=True)
    dist.destroy_process_group()
