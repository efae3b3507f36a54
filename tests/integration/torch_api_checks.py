"""A worker program that checks ddl.torch (Horovod's API over libddl) on every rank: run by
test_ddl_torch.py under `ddl run -np N`. Each check prints "ok NAME" or "FAIL NAME: why"; expected
values are computed here from every rank's inputs, which each rank can rebuild from the rank number."""
import os
import sys
import tempfile

import torch

import ddl.torch as hvd
from worker_checks import check, expect_error, failures


# ---- before init ----

@check("ops before init raise ValueError")
def _():
    assert not hvd.is_initialized()
    expect_error(ValueError, hvd.allreduce, torch.ones(2))
    expect_error(ValueError, hvd.allreduce_async_, torch.ones(2), name="before.init")  # the named world path
    expect_error(ValueError, hvd.rank)
    err = expect_error(ValueError, hvd.broadcast_object, {"a": 1})
    assert "hvd.init()" in str(err), err  # a Horovod script never calls libddl's ddl_init()


hvd.init()
R, N = hvd.rank(), hvd.size()
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def data(rank, shape=(3, 4), dtype=torch.float32, seed=0):
    """Rank `rank`'s input: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(1, 5, shape, generator=g).to(dtype)


@check("topology and build flags")
def _():
    # ddl run's variables, or torchrun's where the world came through torch's store
    assert (R, N) == (int(os.environ.get("DDL_RANK", os.environ.get("RANK"))), int(os.environ.get("DDL_SIZE", os.environ.get("WORLD_SIZE"))))
    assert hvd.local_rank() == R and hvd.local_size() == N
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1 and hvd.is_homogeneous()
    assert hvd.gloo_built() and not hvd.mpi_built() and not hvd.mpi_enabled() and not hvd.ccl_built()
    assert bool(hvd.nccl_built()) == hvd.cuda_built()


@check("allreduce: every dtype and op against the reference")
def _():
    for dtype in INTS + FLOATS:
        every = [data(r, dtype=dtype).double() for r in range(N)]
        stack = torch.stack(every)
        refs = {hvd.Sum: stack.sum(0), hvd.Min: stack.min(0).values, hvd.Max: stack.max(0).values,
                hvd.Product: stack.prod(0), hvd.Average: stack.sum(0) / N}
        for op, ref in refs.items():
            if dtype in (torch.uint8, torch.int8) and op in (hvd.Sum, hvd.Product, hvd.Average):
                continue  # would overflow 8 bits
            out = hvd.allreduce(data(R, dtype=dtype), op=op)
            assert out.dtype == dtype, (dtype, out.dtype)
            if op == hvd.Average and not dtype.is_floating_point:
                ref = torch.trunc(ref)
            assert torch.equal(out.double(), ref.to(dtype).double()), (dtype, op, out, ref)


@check("allreduce: MIN and MAX are NaN where any rank's value is, whichever rank held it")
def _():
    for holder in range(N):
        for dtype in FLOATS:
            mine = torch.full((3,), float(R + 1), dtype=dtype)
            if R == holder:
                mine[1] = float("nan")
            for op in (hvd.Min, hvd.Max):
                out = hvd.allreduce(mine, op=op, name=f"nan.{holder}.{dtype}.{op}")
                assert torch.isnan(out[1]) and not torch.isnan(out[0]), (holder, dtype, op, out)


@check("allreduce: prescale and postscale as Horovod computes them")
def _():
    for dtype in (torch.int32, torch.float32, torch.float64):
        x = data(R, dtype=dtype)
        out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        ref = sum(((data(r, dtype=dtype).double() * 0.5).to(dtype).double() for r in range(N)))
        ref = (ref * 3.0).to(dtype)
        assert torch.equal(out, ref), (dtype, out, ref)
    # An integer average with a post-scale: scaled once by postscale / size, as Horovod's arithmetic
    # (dividing first would truncate before the scale).
    x = torch.tensor([3 * R + 1, 7 * R + 2, -R - 1], dtype=torch.int32)
    out = hvd.allreduce(x, op=hvd.Average, postscale_factor=3.0)
    total = sum(torch.tensor([3 * r + 1, 7 * r + 2, -r - 1], dtype=torch.float64) for r in range(N))
    assert torch.equal(out, (total * (3.0 / N)).to(torch.int32)), (out, total)
    # A NaN factor that every rank passes is the same op on every rank (factors compare by their bits).
    assert torch.isnan(hvd.allreduce(torch.ones(2), prescale_factor=float("nan"))).all()


@check("allreduce_ in place, async with poll, grouped and non-contiguous tensors")
def _():
    x = data(R)
    assert hvd.allreduce_(x, op=hvd.Sum) is x
    assert torch.equal(x, sum(data(r) for r in range(N)))
    h = hvd.allreduce_async(data(R), op=hvd.Max, name="async.max")
    assert hvd.synchronize(h).equal(torch.stack([data(r) for r in range(N)]).max(0).values)
    h = hvd.allreduce_async(torch.ones(1), name="p")
    assert isinstance(hvd.poll(h), bool)
    hvd.synchronize(h)
    expect_error(ValueError, hvd.poll, h)
    tensors = [data(R, seed=i) for i in range(5)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for i, o in enumerate(outs):
        assert torch.equal(o, sum(data(r, seed=i) for r in range(N)))
    t = data(R, shape=(4, 3)).t()  # not contiguous
    hvd.allreduce_(t, op=hvd.Sum)
    assert torch.equal(t, sum(data(r, shape=(4, 3)) for r in range(N)).t())


@check("the per-op path (compiled, or ctypes with DDL_PYTHON_FASTPATH=0); a name stays taken while its op is in flight")
def _():
    from ddl.common import fastpath
    expected = os.environ.get("DDL_TEST_EXPECT_FASTPATH")  # set by test_ddl_torch.py
    if expected:
        assert fastpath.compiled == (expected == "compiled"), (expected, fastpath.compiled, fastpath.why_not_compiled)
        assert fastpath.why_not_compiled == (None if expected == "compiled" else "DDL_PYTHON_FASTPATH=0")
    # Rank 0's op cannot finish before the barrier (the others submit theirs after it), so its second
    # submit under the same name always finds the first in flight.
    t = torch.full((5,), float(R + 1))
    if R == 0:
        h = hvd.allreduce_async_(t, name="taken", op=hvd.Sum)
        expect_error(ValueError, hvd.allreduce_async_, torch.ones(5), name="taken")
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async_(t, name="taken", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((5,), float(N * (N + 1) // 2)))
    h = hvd.allreduce_async(torch.full((2, 3), float(R)), name="taken", op=hvd.Average)  # free again once synchronized
    assert torch.equal(hvd.synchronize(h), torch.full((2, 3), (N - 1) / 2))


@check("a gradient's allreduce_async_ in one compiled call (where compiled): results, handles, names, "
       "and every case it leaves to the general path")
def _():
    from ddl.common import fastpath
    from ddl.torch import mpi_ops
    total = sum(range(1, N + 1))
    hvd.synchronize(hvd.allreduce_async_(torch.ones(7), name="shape.seen", op=hvd.Sum))  # the shape's options now exist

    def async_(*args, **kwargs):
        """allreduce_async_(*args, **kwargs) and whether it took the compiled path."""
        handle = hvd.allreduce_async_(*args, **kwargs)
        return handle, type(mpi_ops._handle_map[handle]) is fastpath.TensorRecord

    t = torch.full((7,), float(R + 1))
    h, compiled = async_(t, name="tensor.path", op=hvd.Sum)
    assert compiled == fastpath.compiled, (compiled, fastpath.compiled)
    assert isinstance(hvd.poll(h), bool)
    assert hvd.synchronize(h) is t and torch.equal(t, torch.full((7,), float(total)))
    expect_error(ValueError, hvd.synchronize, h)  # once only, on either path
    expect_error(ValueError, hvd.poll, h)
    h, compiled = async_(t, name="tensor.path", op=hvd.Sum)  # the name is free again once synchronized
    assert compiled == fastpath.compiled
    assert torch.equal(hvd.synchronize(h), torch.full((7,), float(total * N)))
    # The default op is Average; a copying allreduce_async leaves its input as it was.
    x = torch.full((7,), float(R))
    out = hvd.synchronize(hvd.allreduce_async(x, name="tensor.copy"))
    assert torch.equal(x, torch.full((7,), float(R))) and torch.equal(out, torch.full((7,), (N - 1) / 2))
    # A name in flight is refused on this path too (rank 0's first op waits for the others' barrier).
    if R == 0:
        h = hvd.allreduce_async_(torch.ones(7), name="tensor.taken", op=hvd.Sum)
        e = expect_error(ValueError, hvd.allreduce_async_, torch.ones(7), name="tensor.taken", op=hvd.Sum)
        assert "tensor.taken" in str(e) and "in flight" in str(e), e
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async_(torch.ones(7), name="tensor.taken", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((7,), float(N)))
    # What the compiled call leaves to the general path, with the general path's results and errors.
    general = {
        "scaled": dict(op=hvd.Sum, prescale_factor=2.0),
        "averaged": dict(average=False),
        "unnamed": dict(op=hvd.Sum),
    }
    for label, kwargs in general.items():
        y = torch.full((7,), float(R + 1))
        name = None if label == "unnamed" else f"general.{label}"
        h, compiled = async_(y, name=name, **kwargs)
        assert not compiled, label
        factor = 2.0 if label == "scaled" else 1.0
        assert torch.equal(hvd.synchronize(h), torch.full((7,), factor * total)), label
    for odd in (torch.ones(14)[::2], torch.ones(7, dtype=torch.complex64), torch.ones(7, dtype=torch.bool)):
        if odd.dtype == torch.float32:  # not contiguous
            h, compiled = async_(odd, name="general.strided", op=hvd.Sum)
            assert not compiled and torch.equal(hvd.synchronize(h), torch.full((7,), float(N)))
        else:
            expect_error(ValueError, hvd.allreduce_async_, odd, name="general.dtype")
    # Arguments bind as a Python function's would, positional or by keyword, whichever path runs.
    y = torch.full((7,), float(R + 1))
    h, compiled = async_(y, None, "bind.positional", hvd.Sum, 1.0, 1.0, hvd.global_process_set)
    assert compiled == fastpath.compiled and torch.equal(hvd.synchronize(h), torch.full((7,), float(total)))
    h, compiled = async_(tensor=y, process_set=hvd.global_process_set, op=hvd.Sum, name="bind.keywords")
    assert compiled == fastpath.compiled and torch.equal(hvd.synchronize(h), torch.full((7,), float(total * N)))
    for args, kwargs in [((), {}), ((y,), {"nmae": "bind.typo"}), ((y, None), {"average": None, "name": "bind.twice"}),
                         ((y, None, "bind.many", hvd.Sum, 1.0, 1.0, hvd.global_process_set, None), {})]:
        e = expect_error(TypeError, hvd.allreduce_async_, *args, **kwargs)
        assert "allreduce_async_" in str(e), e
    for by_keyword in (False, True):  # synchronize(handle=h) is Horovod's too, on every kind of handle
        h = hvd.allreduce_async_(torch.full((7,), float(R + 1)), name="bind.sync", op=hvd.Sum)
        h2 = hvd.allreduce_async(torch.full((7,), float(R + 1)), name="bind.sync.copy", op=hvd.Sum)
        for handle in (h, h2):
            out = hvd.synchronize(handle=handle) if by_keyword else hvd.synchronize(handle)
            assert torch.equal(out, torch.full((7,), float(total))), (by_keyword, out)
    for args, kwargs in [((), {}), ((1, 2), {}), ((), {"hdl": 1})]:
        e = expect_error(TypeError, hvd.synchronize, *args, **kwargs)
        assert "synchronize" in str(e), e
    # The Python synchronize finishes the compiled call's records as well, should one reach it.
    h = hvd.allreduce_async_(torch.full((7,), float(R + 1)), name="bind.general", op=hvd.Sum)
    assert torch.equal(mpi_ops._synchronize_general(h), torch.full((7,), float(total)))
    assert "allreduce.bind.general" not in mpi_ops._names.taken_in(hvd.global_process_set.process_set_id)
    expect_error(NotImplementedError, hvd.allreduce_async_, torch.ones(7), name="general.adasum", op=hvd.Adasum)
    expect_error(ValueError, hvd.allreduce_async_, torch.ones(7), name="general.op", op=17)
    # An op that fails (shapes differ between ranks) raises at synchronize on every rank, on this path too.
    hvd.synchronize(hvd.allreduce_async_(torch.ones(8), name="shape.seen.2", op=hvd.Sum))
    wrong = torch.ones(7) if R == 0 else torch.ones(8)
    h, compiled = async_(wrong, name="tensor.mismatch", op=hvd.Sum)
    assert compiled == fastpath.compiled
    e = expect_error(RuntimeError, hvd.synchronize, h)
    assert "tensor.mismatch" in str(e), e
    expect_error(ValueError, hvd.synchronize, h)


@check("the compiled call's element count (from the shape) and full names (kept between steps): shapes of "
       "0 and 3 dimensions and with no elements, a non-ASCII name, a NUL refused, 70,000 distinct names")
def _():
    from ddl.common import fastpath
    from ddl.torch import mpi_ops
    total = sum(range(1, N + 1))
    for shape in [(2, 3, 4), (), (0, 5)]:
        hvd.synchronize(hvd.allreduce_async_(torch.ones(shape), name=f"count.first.{shape}", op=hvd.Sum))
        t = torch.full(shape, float(R + 1))
        h = hvd.allreduce_async_(t, name=f"count.{shape}", op=hvd.Sum)
        assert (type(mpi_ops._handle_map[h]) is fastpath.TensorRecord) == fastpath.compiled, shape
        assert hvd.synchronize(h) is t and torch.equal(t, torch.full(shape, float(total))), (shape, t)
    for step in range(2):  # the second step finds the name made in the first
        t = torch.full((2, 3, 4), float(R + 1))
        h = hvd.allreduce_async_(t, name="count.ünïcode", op=hvd.Sum)
        assert (type(mpi_ops._handle_map[h]) is fastpath.TensorRecord) == fastpath.compiled
        assert torch.equal(hvd.synchronize(h), torch.full((2, 3, 4), float(total)))
    e = expect_error(ValueError, hvd.allreduce_async_, torch.ones(3), name="count.nul\x00name", op=hvd.Sum)
    assert "NUL" in str(e), e
    # More distinct names than the compiled call keeps: each still reduces right and is free afterwards.
    x = torch.ones(2)
    for batch in range(70):
        handles = [hvd.allreduce_async_(x, name=f"count.many.{batch}.{i}", op=hvd.Max) for i in range(1000)]
        assert all(torch.equal(hvd.synchronize(h), x) for h in handles), batch
    assert not mpi_ops._names.taken_in(hvd.global_process_set.process_set_id), "names still taken after synchronize"
    y = torch.full((2,), float(R + 1))
    assert torch.equal(hvd.synchronize(hvd.allreduce_async_(y, name="count.many.0.0", op=hvd.Sum)), torch.full((2,), float(total)))


@check("allgather: first dimensions differing by rank, bool, grouped")
def _():
    x = torch.full((R + 1, 2), R, dtype=torch.int16)
    out = hvd.allgather(x)
    assert torch.equal(out, torch.cat([torch.full((r + 1, 2), r, dtype=torch.int16) for r in range(N)]))
    b = hvd.allgather(torch.tensor([R % 2 == 0]))
    assert b.dtype == torch.bool and b.tolist() == [r % 2 == 0 for r in range(N)]
    outs = hvd.grouped_allgather([torch.full((1,), R), torch.full((2,), 10 * R)])
    assert outs[0].tolist() == list(range(N)) and outs[1].tolist() == [10 * r for r in range(N) for _ in (0, 1)]
    # Rows of no elements: the rows still add up (the result was (0, 0) whatever the ranks had).
    assert hvd.allgather(torch.ones(R + 2, 0)).shape == (sum(r + 2 for r in range(N)), 0)


@check("broadcast: every root, in place and copying")
def _():
    for root in range(N):
        out = hvd.broadcast(data(R), root)
        assert torch.equal(out, data(root))
        x = data(R, dtype=torch.float16)
        hvd.broadcast_(x, root)
        assert torch.equal(x, data(root, dtype=torch.float16))


@check("alltoall: equal and given splits, received splits")
def _():
    x = torch.arange(2 * N) + 100 * R
    out = hvd.alltoall(x)
    assert out.tolist() == [100 * r + 2 * R + k for r in range(N) for k in (0, 1)]
    splits = torch.tensor([r + 1 for r in range(N)], dtype=torch.int32)  # rank j gets j+1 rows from everyone
    rows = torch.cat([torch.full((j + 1, 2), 10 * R + j) for j in range(N)])
    out, received = hvd.alltoall(rows, splits)
    assert received.tolist() == [R + 1] * N
    assert torch.equal(out, torch.cat([torch.full((R + 1, 2), 10 * r + R) for r in range(N)]))
    out, received = hvd.alltoall(rows[:, :0], splits)  # rows of no elements: the splits still arrive
    assert received.tolist() == [R + 1] * N and out.shape == (N * (R + 1), 0)


@check("alltoall_async and allgather_async submitted in opposite orders on different ranks")
def _():
    def a2a():
        return hvd.alltoall_async(torch.arange(N) + 10 * R, name="order.a2a")

    def ag():
        return hvd.allgather_async(torch.full((R + 1,), R), name="order.ag")
    first, second = (a2a, ag) if R % 2 == 0 else (ag, a2a)
    handles = [first(), second()]  # neither submit may wait for the peers
    results = [hvd.synchronize(h) for h in handles]
    gathered = results[1] if R % 2 == 0 else results[0]
    exchanged, received = results[0] if R % 2 == 0 else results[1]
    assert received.tolist() == [1] * N, received
    assert gathered.tolist() == [r for r in range(N) for _ in range(r + 1)], gathered
    assert exchanged.tolist() == [R + 10 * r for r in range(N)], exchanged


@check("reducescatter: uneven rows go to the first ranks")
def _():
    rows = 2 * N + 1
    x = data(R, shape=(rows, 2))
    out = hvd.reducescatter(x, op=hvd.Sum)
    total = sum(data(r, shape=(rows, 2)) for r in range(N))
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    start = sum(counts[:R])
    assert torch.equal(out, total[start:start + counts[R]])
    avg = hvd.grouped_reducescatter([x.double()], op=hvd.Average)[0]
    assert torch.allclose(avg, total[start:start + counts[R]].double() / N)


@check("reducescatter: fewer rows than ranks, the last ranks get none")
def _():
    # The empty output's storage is NULL: refused on those ranks, it left the others waiting.
    out = hvd.reducescatter(torch.full((1, 2), float(R + 1)), op=hvd.Sum)
    expected = torch.full((1, 2), float(N * (N + 1) // 2)) if R == 0 else torch.zeros((0, 2))
    assert torch.equal(out, expected), out


@check("process sets: ops within a set, membership and duplicate errors")
def _():
    evens = hvd.add_process_set([r for r in range(N) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(N) if r % 2 == 1]) if N > 1 else None
    mine = evens if R % 2 == 0 else odds
    members = mine.ranks
    assert mine.size() == len(members) and mine.rank() == members.index(R) and mine.included()
    out = hvd.allreduce(data(R), op=hvd.Sum, process_set=mine)
    assert torch.equal(out, sum(data(r) for r in members))
    gathered = hvd.allgather(torch.tensor([R]), process_set=mine)
    assert gathered.tolist() == members
    assert hvd.broadcast(torch.tensor([R]), members[-1], process_set=mine).tolist() == [members[-1]]
    other = odds if mine is evens else evens
    if other is not None:
        assert other.rank() == -1 and not other.included()
        expect_error(ValueError, hvd.allreduce, torch.ones(1), process_set=other)
    expect_error(ValueError, hvd.add_process_set, list(evens.ranks))
    hvd.barrier(process_set=mine)
    # An allgather synchronized after its set was removed: its size was read at synchronize (a TypeError).
    gathering = hvd.allgather_async(torch.tensor([R]), process_set=evens) if mine is evens else None
    assert hvd.remove_process_set(evens)
    if gathering is not None:
        assert hvd.synchronize(gathering).tolist() == list(range(0, N, 2))
    if odds is not None:
        assert hvd.remove_process_set(odds)
    assert not hvd.remove_process_set(evens)
    # Ranks from any iterable of integers, as Horovod takes them; nothing else.
    assert hvd.ProcessSet(reversed(range(N))).ranks == list(range(N))
    assert hvd.ProcessSet(iter([N - 1, 0])).ranks == sorted({0, N - 1})
    expect_error(ValueError, hvd.start_timeline, "/tmp/timeline\0.json")  # would have written /tmp/timeline
    for bad in ([0.5], ["0"], "01", 3, [True], [0, 2**32 + 1], [-1]):  # 2**32 + 1 was passed on to libddl as rank 1
        expect_error(ValueError, hvd.ProcessSet, bad)
    if N > 1:  # init(process_sets=) with a duplicate adds none of them, so a corrected call works
        expect_error(ValueError, hvd.init, process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0])])
        first = hvd.ProcessSet([0])
        hvd.init(process_sets=[first])
        assert first.process_set_id is not None and first.size() == 1
        assert hvd.remove_process_set(first)
    # Horovod's other forms: "dynamic" (sets added later) and comm listing the world's ranks.
    hvd.init(comm=list(reversed(range(N))), process_sets="dynamic")
    if N > 1:
        e = expect_error(ValueError, hvd.init, comm=[0])
        assert "cannot run on a part of them" in str(e), e


@check("errors: mismatched shapes and dtypes fail on every rank, bad input fails at once")
def _():
    if N > 1:
        e = expect_error(RuntimeError, hvd.allreduce, torch.ones(3 + R), name="mismatch.1")
        assert "mismatch.1" in str(e), e
        expect_error(RuntimeError, hvd.allreduce, torch.ones(2, 6) if R == 0 else torch.ones(3, 4), name="mismatch.2")
        expect_error(RuntimeError, hvd.allgather, torch.ones(2, R + 1))
        expect_error(RuntimeError, hvd.broadcast, torch.ones(2), R)
        # bool and uint8 move alike, as bytes, but are not one type: rank 0's bools never arrive as numbers.
        flags_or_bytes = torch.tensor([True, False]) if R == 0 else torch.tensor([7, 200], dtype=torch.uint8)
        e = expect_error(RuntimeError, hvd.allgather, flags_or_bytes)
        assert "bool" in str(e) and "uint8" in str(e), e
        expect_error(RuntimeError, hvd.broadcast, flags_or_bytes, N - 1)
        # Those were unnamed, and every rank submitted them: the unnamed count stays in step.
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(N)))
    expect_error(ValueError, hvd.allreduce, torch.ones(2, dtype=torch.complex64))
    expect_error(NotImplementedError, hvd.allreduce, torch.ones(2), op=hvd.Adasum)
    if N > 1:
        expect_error(ValueError, hvd.alltoall, torch.ones(N + 1))
    expect_error(ValueError, hvd.alltoall, torch.ones(N), torch.ones(N))
    expect_error(ValueError, hvd.reducescatter, torch.ones(N, 2), op=hvd.Max)  # Sum or Average, as Horovod and ddl.tensorflow
    sparse = hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), name="sparse.handle", op=hvd.Sum)
    err = expect_error(ValueError, hvd.synchronize, sparse)  # a callable, as Horovod's: it says to call it
    assert "call it" in str(err), err
    assert torch.equal(sparse().to_dense(), torch.full((2,), float(N)))
    # A refused values gather gives back the indices gather already started: its name is free again.
    busy = hvd.allgather_async(torch.ones(1), name="sparse.busy.values")
    expect_error(ValueError, hvd.sparse_allreduce_async, torch.ones(2).to_sparse(), name="sparse.busy", op=hvd.Sum)
    hvd.synchronize(busy)
    again = hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), name="sparse.busy", op=hvd.Sum)
    assert torch.equal(again().to_dense(), torch.full((2,), float(N)))
    expect_error(ValueError, hvd.broadcast, torch.ones(1), N)
    x = torch.ones(4)
    h = hvd.allreduce_async(x, name="dup")
    expect_error(ValueError, hvd.allreduce_async, x, name="dup")
    hvd.synchronize(h)
    hvd.synchronize(hvd.allreduce_async(x, name="dup"))  # free again once synchronized


@check("a call only one rank cannot make still takes its place: the others fail with its reason, the next ops pair right")
def _():
    if N < 2:
        return
    last = R == N - 1  # the rank whose arguments are wrong
    complex_or_real = torch.ones(2, dtype=torch.complex64) if last else torch.ones(2)
    bad_calls = [  # (what, the call on every rank; the last rank's arguments fail its own checks)
        ("allreduce_async of a dtype libddl lacks", lambda: hvd.synchronize(hvd.allreduce_async(complex_or_real))),
        ("allgather of a dtype that cannot move", lambda: hvd.allgather(complex_or_real)),
        ("alltoall with splits that do not fit", lambda: hvd.alltoall(torch.ones(N), splits=[N + 1] + [0] * (N - 1) if last else None)),
        ("blocking broadcast_ from a root outside the set", lambda: hvd.broadcast_(torch.ones(2), N if last else 0)),
        ("reducescatter of a scalar", lambda: hvd.reducescatter(torch.ones(()) if last else torch.ones(N))),
        ("grouped_allreduce with one bad part", lambda: hvd.grouped_allreduce([torch.ones(1), complex_or_real, torch.ones(1)])),
    ]
    for what, call in bad_calls:
        err = expect_error(ValueError, call)
        if not last:
            assert f"failed on rank {N - 1}" in str(err), (what, str(err))
        summed = hvd.allreduce(torch.full((2,), 100.0 * (R + 1)), op=hvd.Sum)
        assert torch.equal(summed, torch.full((2,), 100.0 * N * (N + 1) / 2)), (what, summed)
        gathered = hvd.allgather(torch.full((1,), float(R)))
        assert torch.equal(gathered, torch.arange(N, dtype=torch.float32)), (what, gathered)
    # A named call refused on this rank takes no place: its name is free again at once.
    for step in range(5):
        expect_error(ValueError, hvd.allreduce, torch.ones(2, dtype=torch.complex64), name=f"retry.{step}")
        assert torch.equal(hvd.allreduce(torch.ones(2), name=f"retry.{step}", op=hvd.Sum), torch.full((2,), float(N)))


@check("blocking ops in a loop (libddl's fast path): named and unnamed allreduce, broadcast_, barrier; a shape change fails everywhere")
def _():
    for step in range(50):
        x = data(R, (5,), seed=step)
        want = sum(data(r, (5,), seed=step) for r in range(N))
        got = hvd.allreduce(x, name="fast.metric", op=hvd.Sum)
        assert torch.equal(got, want), (step, got, want)
        assert torch.equal(hvd.allreduce(x, op=hvd.Sum), want)  # unnamed
        y = x.clone()
        assert hvd.allreduce_(y, name="fast.avg", op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5) is y
        assert torch.allclose(y, want / N), (y, want / N)
        b = torch.full((3,), float(R))
        hvd.broadcast_(b, root_rank=N - 1, name="fast.bcast")
        assert torch.equal(b, torch.full((3,), float(N - 1))), b
        hvd.barrier()
    if N > 1:  # the last rank changes the shape of an op every rank ran fifty times
        e = expect_error(RuntimeError, hvd.allreduce, torch.ones(4 if R == N - 1 else 5), name="fast.metric")
        assert "fast.metric" in str(e) and "differs between ranks" in str(e), e
    assert torch.equal(hvd.allreduce(torch.ones(5), name="fast.metric", op=hvd.Sum), torch.full((5,), float(N)))


@check("C API: an alltoallv whose counts differ from what a peer sends fails on every rank, then the next one works")
def _():
    import ctypes
    from ddl import _lib as L
    sizes = lambda v: (ctypes.c_size_t * N)(*v)
    send = torch.arange(N, dtype=torch.int64) + 10 * R
    # Rank 0 wants 5 from the last rank, which sends 1; then fewer than it sends (the block would be cut short).
    for n, wanted in enumerate((5, 0)):
        expect = [1] * N if R != 0 else [1] * (N - 1) + [wanted]
        recv = torch.full((sum(expect),), -1, dtype=torch.int64)
        h = ctypes.c_void_p()
        assert L.lib.ddl_alltoallv_ex(f"raw.alltoallv.{n}".encode(), send.data_ptr(), sizes([1] * N), recv.data_ptr(),
                                      sizes(expect), L.INT64, None, ctypes.byref(h)) == L.SUCCESS
        status = L.lib.ddl_wait(h)
        said = L.last_error()
        assert status == L.MISMATCH, (status, said)
        if R == 0:
            assert f"expected {wanted} elements from rank {N - 1}, which sent it 1" in said, said
        else:
            assert "another rank expected other counts" in said, said
        assert torch.equal(recv, torch.full_like(recv, -1)), recv  # nothing written
    recv = torch.zeros(N, dtype=torch.int64)
    h = ctypes.c_void_p()
    assert L.lib.ddl_alltoallv_ex(b"raw.alltoallv.ok", send.data_ptr(), sizes([1] * N), recv.data_ptr(), sizes([1] * N),
                                  L.INT64, None, ctypes.byref(h)) == L.SUCCESS
    assert L.lib.ddl_wait(h) == L.SUCCESS and recv.tolist() == [10 * r + R for r in range(N)], recv


@check("autograd of allreduce, allgather, broadcast, alltoall and reducescatter")
def _():
    x = data(R, dtype=torch.float64).requires_grad_()
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, N))
    y = torch.ones(R + 1, 2, dtype=torch.float64, requires_grad=True)
    g = hvd.allgather(y)
    (g * torch.arange(g.shape[0], dtype=torch.float64).unsqueeze(1)).sum().backward()
    start = sum(r + 1 for r in range(R))
    assert torch.equal(y.grad[:, 0], torch.arange(start, start + R + 1, dtype=torch.float64))
    z = torch.ones(3, dtype=torch.float64, requires_grad=True)
    hvd.broadcast(z, 0).sum().backward()
    assert torch.equal(z.grad, torch.full_like(z, 1.0 if R == 0 else 0.0))
    w = torch.ones(2 * N, dtype=torch.float64, requires_grad=True)
    (hvd.alltoall(w) * 2).sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 2.0))
    v = torch.ones(2 * N, dtype=torch.float64, requires_grad=True)
    hvd.reducescatter(v, op=hvd.Average).sum().backward()
    assert torch.equal(v.grad, torch.ones_like(v))


def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def _zero_grad_mid_step(opt, net):
    x, y = batch(R, 99)
    torch.nn.functional.mse_loss(net(x), y).backward()
    try:
        opt.zero_grad()
    finally:
        opt.synchronize()


@check("DistributedOptimizer equals SGD on the averaged gradient (plain, grouped, fp16, 2 passes per step)")
def _():
    for kwargs in ({}, {"groups": 2}, {"compression": hvd.Compression.fp16}, {"backward_passes_per_step": 2},
                   {"gradient_predivide_factor": 2.0}):
        net, ref = model(), model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                       named_parameters=net.named_parameters(), **kwargs)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        passes = kwargs.get("backward_passes_per_step", 1)
        for step in range(3):
            opt.zero_grad()
            for p in range(passes):
                x, y = batch(R, 10 * step + p)
                torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            ref_opt.zero_grad()
            for r in range(N):  # the average over ranks of each rank's accumulated gradient
                for p in range(passes):
                    x, y = batch(r, 10 * step + p)
                    (torch.nn.functional.mse_loss(ref(x), y) / N).backward()
            ref_opt.step()
        tol = 2e-3 if "compression" in kwargs else 1e-5
        for a, b in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(a, b, atol=tol), (kwargs, (a - b).abs().max())
        expect_error(AssertionError, _zero_grad_mid_step, opt, net)


@check("DistributedOptimizer: explicit groups (tuples too) keep only the parameters it updates")
def _():
    net, ref = model(), model()
    for m in (net, ref):
        m[0].weight.requires_grad_(False)  # frozen: no gradient, so weight decay leaves it alone
    frozen = net[0].weight.detach().clone()
    foreign = torch.zeros(2, requires_grad=True)  # not the optimizer's: left out, not a KeyError
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=0.5),
                                   named_parameters=net.named_parameters(),
                                   groups=[tuple(net.parameters()) + (foreign,)])
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, weight_decay=0.5)
    x, y = batch(R, 7)
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
    for r in range(N):
        x, y = batch(r, 7)
        (torch.nn.functional.mse_loss(ref(x), y) / N).backward()
    ref_opt.step()
    assert net[0].weight.grad is None and torch.equal(net[0].weight, frozen)
    for a, b in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


@check("broadcast_optimizer_state: zero gradients make the state (the caller's kept), SparseAdam, model=")
def _():
    net = torch.nn.Linear(3, 1, bias=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.ones(1, 3) * (R + 1)).sum().backward()
    mine = net.weight.grad.clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert torch.equal(opt.state[net.weight]["momentum_buffer"], torch.zeros(1, 3))  # not rank 0's gradient
    assert torch.equal(net.weight.grad, mine)
    emb = torch.nn.Sequential(torch.nn.Embedding(5, 2, sparse=True))
    hvd.broadcast_optimizer_state(torch.optim.SparseAdam(emb.parameters()), 0)  # sparse zero gradients
    hvd.broadcast_optimizer_state(torch.optim.SGD(emb.parameters(), lr=0.1), 0, model=emb)
    hvd.broadcast_optimizer_state(torch.optim.SGD(emb.parameters(), lr=0.1), 0, hvd.global_process_set)


@check("broadcast_parameters takes a list of tensors; in-place ops write into Parameters, contiguous or not")
def _():
    torch.manual_seed(R)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)  # a non-contiguous Parameter
    hvd.broadcast_parameters(list(conv.parameters()), root_rank=0)
    torch.manual_seed(0)
    want = torch.nn.Conv2d(3, 4, 3)
    assert torch.equal(conv.weight, want.weight) and torch.equal(conv.bias, want.bias)
    hvd.allreduce_(conv.weight, op=hvd.Sum, name="leaf.weight")
    hvd.synchronize(hvd.allreduce_async_(conv.bias, op=hvd.Sum, prescale_factor=0.5, name="leaf.bias"))
    assert torch.allclose(conv.weight, want.weight * N) and torch.allclose(conv.bias, want.bias * N * 0.5)
    assert conv.weight.requires_grad and conv.weight.is_leaf


@check("DistributedOptimizer: duplicate or missing names are ValueErrors")
def _():
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    expect_error(ValueError, hvd.DistributedOptimizer, opt, named_parameters=[("a", p) for p in net.parameters()])
    expect_error(ValueError, hvd.DistributedOptimizer, opt, named_parameters=list(net.named_parameters())[:1])


@check("broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object")
def _():
    torch.manual_seed(R)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.01 * (R + 1))
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    params = hvd.allgather_object([p.detach().clone() for p in net.parameters()])
    for theirs in params:
        assert all(torch.equal(a, b) for a, b in zip(theirs, net.parameters()))
    assert hvd.broadcast_object({"rank": R} if R == N - 1 else None, root_rank=N - 1) == {"rank": N - 1}
    assert hvd.allgather_object(("r", R)) == [("r", r) for r in range(N)]


@check("object collectives: a rank whose object does not pickle fails every rank, and the next call pairs right")
def _():
    import threading
    unpicklable = threading.Lock()
    last = N - 1
    e = expect_error((TypeError, RuntimeError), hvd.broadcast_object, unpicklable if R == last else None, root_rank=last)
    assert isinstance(e, TypeError if R == last else RuntimeError), e
    assert R == last or f"rank {last} could not serialize" in str(e), e
    assert hvd.broadcast_object(("second", R), root_rank=last) == ("second", last)
    e = expect_error((TypeError, RuntimeError), hvd.allgather_object, unpicklable if R == 0 else ("first", R))
    assert isinstance(e, TypeError if R == 0 else RuntimeError), e
    assert hvd.allgather_object(("second", R)) == [("second", r) for r in range(N)]
    try:
        import cloudpickle  # noqa: F401  (Debian's python3-cloudpickle: Horovod sends objects with it)
    except ImportError:
        print("note: cloudpickle is not installed here: lambdas were not broadcast", flush=True)
        return
    k = 3 + R
    f = hvd.broadcast_object(lambda x: x * k, root_rank=0)
    assert f(2) == 6, f(2)
    assert [g(1) for g in hvd.allgather_object(lambda x: x + R)] == [1 + r for r in range(N)]


@check("join: a rank with fewer batches adds each reduction's identity; everyone learns the last rank to join")
def _():
    if N == 1:
        assert hvd.join() == 0
        return
    if R != 0:
        out = hvd.allreduce(torch.full((3,), float(R)), op=hvd.Sum, name="join.step")
        assert out.tolist() == [float(sum(range(1, N)))] * 3, out
        # Where zeros would change the result (a MAX of negatives, a MIN of positives, any PRODUCT),
        # the joined rank 0 adds the reduction's identity instead.
        out = hvd.allreduce(torch.full((2,), -1.0 - R), op=hvd.Max, name="join.max")
        assert out.tolist() == [-2.0] * 2, out
        out = hvd.allreduce(torch.full((2,), -1 - R, dtype=torch.int32), op=hvd.Max, name="join.max_int")
        assert out.tolist() == [-2] * 2, out
        out = hvd.allreduce(torch.full((2,), 1.0 + R, dtype=torch.float16), op=hvd.Min, name="join.min")
        assert out.tolist() == [2.0] * 2, out
        out = hvd.allreduce(torch.full((2,), 2.0, dtype=torch.float64), op=hvd.Product, name="join.product")
        assert out.tolist() == [2.0 ** (N - 1)] * 2, out
        # Gathers cannot stand in for a joined rank: they fail (unnamed, so these ranks count one
        # more unnamed op than rank 0).
        expect_error(RuntimeError, hvd.allgather, torch.ones(1))
    last = hvd.join()
    assert hvd.allgather_object(last) == [last] * N and last != 0, last
    # After the join every rank counts unnamed ops afresh, so they match again.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == N


@check("SyncBatchNorm matches BatchNorm over the whole batch")
def _():
    full = torch.stack([data(r, shape=(2, 3), dtype=torch.float64) for r in range(N)]).view(2 * N, 3)
    sync = hvd.SyncBatchNorm(3).double()
    bn = torch.nn.BatchNorm1d(3).double()
    mine = full[2 * R:2 * R + 2].clone().requires_grad_()
    whole = full.clone().requires_grad_()
    out = sync(mine)
    ref = bn(whole)
    assert torch.allclose(out, ref[2 * R:2 * R + 2])
    assert torch.allclose(sync.running_mean, bn.running_mean) and torch.allclose(sync.running_var, bn.running_var)
    (out * torch.arange(6, dtype=torch.float64).view(2, 3)).sum().backward()
    weights = torch.arange(6, dtype=torch.float64).view(2, 3).repeat(N, 1)
    (ref * weights).sum().backward()
    assert torch.allclose(mine.grad, whole.grad[2 * R:2 * R + 2])


@check("SyncBatchNorm keeps the variance of float32 inputs far from zero, and takes a rank with no rows")
def _():
    # Mean 1e4 against a spread of 1: a variance from sums of x and x^2 in float32 came out 2.55.
    g = torch.Generator().manual_seed(5)
    full = (torch.randn(8 * N, 3, generator=g) + torch.tensor([1e4, -3e3, 0.5])).float()
    rows = 8 if R < N - 1 or N == 1 else 0  # the last rank brings an empty batch
    start = 8 * R
    mine = full[start:start + rows].clone().requires_grad_()
    whole = full[:8 * (N - 1) or 8].double().requires_grad_()  # every row some rank brings
    sync = hvd.SyncBatchNorm(3)
    bn = torch.nn.BatchNorm1d(3).double()
    out = sync(mine)
    ref = bn(whole)
    # float32 holds 1e4 to ~1e-3, so the normalized values can be as far off as that and no further.
    assert (out.double() - ref[start:start + rows]).abs().max().item() < 1e-2 if rows else out.shape == (0, 3)
    assert torch.allclose(sync.running_var.double(), bn.running_var, rtol=1e-2), (sync.running_var, bn.running_var)
    assert torch.allclose(sync.running_mean.double(), bn.running_mean, rtol=1e-6)
    weights = torch.arange(whole.shape[0] * 3, dtype=torch.float64).view(-1, 3) / 10  # each row's own
    (out * weights[start:start + rows].float()).sum().backward()
    (ref * weights).sum().backward()
    assert (mine.grad.double() - whole.grad[start:start + rows]).abs().max().item() < 1e-1 if rows else True


@check("SyncBatchNorm without running statistics: the whole batch's in training and in eval (as Horovod)")
def _():
    full = torch.stack([data(r, shape=(2, 3), dtype=torch.float64) for r in range(N)]).view(2 * N, 3)
    ref = torch.nn.functional.batch_norm(full, None, None, training=True)[2 * R:2 * R + 2]
    sync = hvd.SyncBatchNorm(3, momentum=None, track_running_stats=False).double()
    assert torch.allclose(sync(full[2 * R:2 * R + 2]), ref)  # momentum=None has no count to keep here
    assert torch.allclose(sync.eval()(full[2 * R:2 * R + 2]), ref)


@check("timeline: start_timeline writes Chrome-trace JSON of named ops")
def _():
    # "%r": every rank its own file (a plain path is written by rank 0 alone; test_ddl_torch checks that)
    run_id = os.environ.get("DDL_RUN_ID") or f"port{os.environ['MASTER_PORT']}"  # ddl run's, or torchrun's port
    hvd.start_timeline(os.path.join(tempfile.gettempdir(), f"ddl-torch-timeline-{run_id}-%r.json"))
    path = os.path.join(tempfile.gettempdir(), f"ddl-torch-timeline-{run_id}-{R}.json")
    hvd.allreduce(torch.ones(3), name="timeline.op")
    hvd.stop_timeline()
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    assert "allreduce.timeline.op" in text, text[:500]


@check("op names: a NUL is refused, a str subclass names its op as str does on either path")
def _():
    import enum
    expect_error(ValueError, hvd.allreduce_async_, torch.ones(2), name="grad\0a")

    class Grad(str, enum.Enum):
        W = "w"
    # One rank's tensor takes the compiled path (contiguous), the other's the general one (transposed).
    x = torch.ones(2, 2) * (R + 1) if R % 2 == 0 else (torch.ones(2, 2) * (R + 1)).t()
    assert torch.equal(hvd.synchronize(hvd.allreduce_async_(x, name=Grad.W, op=hvd.Sum)),
                       torch.full((2, 2), float(N * (N + 1) // 2)))


@check("poll on one thread while another synchronizes the same handles")
def _():
    import threading
    current, stop, unexpected = [None], [False], []

    def poller():
        while not stop[0]:
            handle = current[0]
            if handle is None:
                continue
            try:
                hvd.poll(handle)
            except ValueError:  # synchronized meanwhile
                pass
            except Exception as error:  # noqa: BLE001 (anything else is the failure)
                unexpected.append(repr(error))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can: the race shows in a few hundred ops
    thread = threading.Thread(target=poller)
    thread.start()
    try:
        x = torch.ones(8)
        for _ in range(3000):
            handle = hvd.allreduce_async_(x, name="polled", op=hvd.Sum)
            current[0] = handle
            hvd.synchronize(handle)
    finally:
        stop[0] = True
        thread.join()
        sys.setswitchinterval(switch)
    assert not unexpected, unexpected[:3]


@check("waits that run libddl's rounds: synchronize on another thread; two threads at once, in crossed orders")
def _():
    import threading
    # A waiter runs the negotiation rounds itself (ddl_wait); here it is not the submitting thread,
    # and two waiters of one rank run at once, each op completing only with the other ranks' other thread.
    expected = float(N * (N + 1) // 2)
    outputs, errors = {}, []

    def run(target):
        try:
            target()
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(repr(error))

    handles = [hvd.allreduce_async_(torch.full((16,), float(R + 1)), name=f"elsewhere.{i}", op=hvd.Sum) for i in range(50)]
    waiter = threading.Thread(target=run, args=(lambda: outputs.update(elsewhere=[hvd.synchronize(h) for h in handles]),))
    waiter.start()
    waiter.join()
    assert not errors, errors
    assert all(torch.equal(out, torch.full((16,), expected)) for out in outputs["elsewhere"])

    def steps(prefix):
        def body():
            outputs[prefix] = [hvd.synchronize(hvd.allreduce_async_(torch.full((4,), float(R + 1)), name=f"{prefix}.{i}", op=hvd.Sum))
                               for i in range(200)]
        return body
    order = ["first", "second"] if R % 2 == 0 else ["second", "first"]
    threads = [threading.Thread(target=run, args=(steps(prefix),)) for prefix in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for prefix in order:
        assert all(torch.equal(out, torch.full((4,), expected)) for out in outputs[prefix]), prefix


@check("named groups of different sizes fail on every rank at once, the parts only some ranks have too")
def _():
    import time
    started = time.monotonic()
    err = expect_error(RuntimeError, hvd.grouped_allreduce, [torch.ones(1)] * (R + 1), name="sizes.apart")
    assert "differs between ranks" in str(err) or "a part of a grouped call" in str(err), str(err)
    assert time.monotonic() - started < 15, "the larger group's rank waited for parts no other rank submits"
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="named.after.sizes"), torch.full((2,), float(N)))


@check("unnamed groups of different sizes fail on every rank; later unnamed ops fail at once, named ones run")
def _():
    # Rank r groups r + 1 tensors: before, rank 0 got a value paired with another rank's first
    # tensor and the unnamed numbering stayed apart for good. The checks after this one shut down and
    # init again, which mends the order.
    import time
    inputs = [torch.ones(1) * (R + 1)] * (R + 1)
    err = expect_error(RuntimeError, hvd.grouped_allreduce, inputs)
    assert "op 'unnamed." in str(err) and "differs between ranks" in str(err) and "group of" in str(err), str(err)
    started = time.monotonic()
    err = expect_error(RuntimeError, hvd.allreduce, torch.ones(2))
    assert "out of step since an earlier one failed" in str(err), str(err)
    assert time.monotonic() - started < 30, "the out-of-step op waited instead of failing at once"
    err = expect_error(RuntimeError, lambda: hvd.synchronize(hvd.allgather_async(torch.ones(1))))
    assert "out of step" in str(err), str(err)
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="named.after.broken"), torch.full((2,), float(N)))


@check("shutdown with an op only some ranks submitted fails it at once, and init works again")
def _():
    import time
    handle = hvd.allreduce_async_(torch.ones(4), name="lonely") if R == 0 else None
    started = time.monotonic()
    hvd.shutdown()
    took = time.monotonic() - started
    assert took < 60, f"shutdown waited {took:.0f} s for an op that another rank never submitted"
    if handle is not None:
        expect_error(ValueError, hvd.synchronize, handle)  # dropped with the world it belonged to
    hvd.init()
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="lonely"), torch.full((2,), float(N)))


@check("shutdown and init again")
def _():
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (R, N)
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(N)))


hvd.shutdown()
print(f"checks done, {len(failures)} failed", flush=True)
sys.exit(1 if failures else 0)
