"""A worker program that checks ddl.tensorflow and ddl.keras (Horovod's TensorFlow and Keras APIs over
libddl) on every rank: run by test_ddl_tensorflow.py under `ddl run -np N`, with TensorFlow 2.15
(Keras 2) and 2.21 (Keras 3). Each check prints "ok NAME" or "FAIL NAME: why"; expected values are
computed here from every rank's inputs, which each rank rebuilds from the rank number. Every op is
checked eagerly and inside tf.function."""
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ddl.tensorflow as hvd  # noqa: E402
import ddl.keras as khvd  # noqa: E402
from worker_checks import check, expect_error, failures  # noqa: E402


@check("ops before init raise ValueError")
def _():
    assert not hvd.is_initialized()
    expect_error(ValueError, hvd.allreduce, tf.ones([2]))
    expect_error(ValueError, hvd.rank)
    err = expect_error(ValueError, hvd.broadcast_object, {"a": 1})
    assert "hvd.init()" in str(err), err  # a Horovod script never calls libddl's ddl_init()


hvd.init()
R, N = hvd.rank(), hvd.size()
MODES = {"eager": lambda f: f, "tf.function": tf.function}
DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]


def data(rank, shape=(3, 4), dtype=tf.float32, seed=0):
    """Rank `rank`'s input: small integers, exact in every dtype."""
    values = np.random.RandomState(1000 * seed + rank).randint(1, 5, size=shape)
    return tf.cast(tf.constant(values), dtype)


def every(shape=(3, 4), dtype=tf.float32, seed=0):
    return np.stack([data(r, shape, dtype, seed).numpy().astype(np.float64) for r in range(N)])


def in_modes(fn):
    """fn run eagerly and inside a tf.function: both results."""
    return {mode: wrap(fn)() for mode, wrap in MODES.items()}


@check("topology, build flags, size_op/rank_op")
def _():
    assert (R, N) == (int(os.environ["DDL_RANK"]), int(os.environ["DDL_SIZE"]))
    assert hvd.local_rank() == R and hvd.local_size() == N and hvd.cross_size() == 1
    assert int(hvd.size_op()) == N and int(hvd.rank_op()) == R and int(hvd.process_set_included_op()) == 1
    assert khvd.rank() == R and khvd.size() == N


@check("allreduce: every dtype and op, eagerly and in tf.function")
def _():
    for dtype in DTYPES:
        stack = every(dtype=dtype)
        refs = {hvd.Sum: stack.sum(0), hvd.Min: stack.min(0), hvd.Max: stack.max(0), hvd.Product: stack.prod(0),
                hvd.Average: stack.sum(0) / N}
        for op, ref in refs.items():
            if dtype in (tf.uint8, tf.int8) and op in (hvd.Sum, hvd.Product, hvd.Average):
                continue  # would overflow 8 bits
            if not dtype.is_floating and op == hvd.Average:
                ref = np.trunc(ref)
            for mode, out in in_modes(lambda: hvd.allreduce(data(R, dtype=dtype), op=op)).items():
                assert out.dtype == dtype, (dtype, out.dtype)
                got = out.numpy().astype(np.float64)
                if op == hvd.Average and dtype.is_floating:  # a division by N: exact to the dtype's precision
                    tolerance = {tf.float16: 2e-3, tf.bfloat16: 1e-2}.get(dtype, 1e-6)
                    assert np.allclose(got, ref, rtol=tolerance), (mode, dtype, op, out, ref)
                else:
                    assert np.array_equal(got, ref), (mode, dtype, op, out, ref)


@check("allreduce: average=, prescale/postscale, fp16 compression, grouped")
def _():
    stack = every()
    for mode, out in in_modes(lambda: hvd.allreduce(data(R), average=False)).items():
        assert np.array_equal(out.numpy(), stack.sum(0)), mode
    for mode, out in in_modes(lambda: hvd.allreduce(data(R), op=hvd.Sum, prescale_factor=0.5,
                                                    postscale_factor=3.0)).items():
        assert np.allclose(out.numpy(), stack.sum(0) * 1.5), mode
    for mode, out in in_modes(lambda: hvd.allreduce(data(R), compression=hvd.Compression.fp16)).items():
        assert out.dtype == tf.float32 and np.allclose(out.numpy(), stack.mean(0), rtol=2e-3), mode  # via fp16
    for mode, outs in in_modes(lambda: hvd.grouped_allreduce([data(R), data(R, (5,), tf.int32, 1)],
                                                             op=hvd.Sum)).items():
        assert np.array_equal(outs[0].numpy(), stack.sum(0)), mode
        assert np.array_equal(outs[1].numpy(), every((5,), tf.int32, 1).sum(0)), mode
    expect_error(ValueError, hvd.allreduce, data(R), average=True, op=hvd.Sum)
    expect_error(NotImplementedError, hvd.allreduce, data(R), op=hvd.Adasum)


@check("allreduce of IndexedSlices: values and indices allgathered, averaged values divided")
def _():
    slices = tf.IndexedSlices(tf.constant([[float(R + 1)] * 2]), tf.constant([R]), dense_shape=tf.constant([N, 2]))
    out = hvd.allreduce(slices)
    assert isinstance(out, tf.IndexedSlices)
    assert out.indices.numpy().tolist() == list(range(N))
    assert np.allclose(out.values.numpy()[:, 0], [(r + 1) / N for r in range(N)])
    expect_error(NotImplementedError, hvd.allreduce, slices, prescale_factor=0.5)  # as Horovod's
    expect_error(NotImplementedError, hvd.grouped_allreduce, [slices], postscale_factor=2.0)


@check("allgather with first dimensions differing by rank, grouped, bool")
def _():
    ref = np.concatenate([np.full((r + 1, 2), r) for r in range(N)])
    for mode, out in in_modes(lambda: hvd.allgather(tf.fill([R + 1, 2], R))).items():
        assert np.array_equal(out.numpy(), ref), (mode, out)
    for mode, outs in in_modes(lambda: hvd.grouped_allgather([tf.fill([R + 1, 2], R),
                                                              tf.constant([R % 2 == 0])])).items():
        assert np.array_equal(outs[0].numpy(), ref) and outs[1].dtype == tf.bool, mode
        assert outs[1].numpy().tolist() == [r % 2 == 0 for r in range(N)], mode
    empty_rows = hvd.allgather(tf.ones((R + 2, 0)))  # rows of no elements: the result was (0, 0)
    assert tuple(empty_rows.shape) == (sum(r + 2 for r in range(N)), 0), empty_rows.shape


@check("broadcast (and bool), broadcast_ into variables, broadcast_variables")
def _():
    root = N - 1
    for mode, out in in_modes(lambda: hvd.broadcast(data(R), root)).items():
        assert np.array_equal(out.numpy(), data(root).numpy()), mode
    assert hvd.broadcast(tf.constant([R == 0, True]), 0).numpy().tolist() == [True, True]
    v = tf.Variable(data(R))
    hvd.broadcast_([v], 0)
    assert np.array_equal(v.numpy(), data(0).numpy())
    single = tf.Variable(float(R))  # one variable, not in a list (an AttributeError before)
    assert float(hvd.broadcast_(single, root).numpy()) == root and float(single.numpy()) == root
    a, b = tf.Variable(float(R)), tf.Variable([R, R])
    hvd.broadcast_variables([a, b], root_rank=root)
    assert float(a.numpy()) == root and b.numpy().tolist() == [root, root]
    expect_error(ValueError, hvd.broadcast, data(R), N + 3)


@check("allgather, broadcast and alltoall move dtypes libddl does not reduce (uint16, uint32, uint64, bool)")
def _():
    if N > 1:  # moved as bytes of their size, but not one type: a uint32 never pairs with an int32
        mixed = tf.constant([R], tf.uint32 if R == 0 else tf.int32)
        err = expect_error(tf.errors.FailedPreconditionError, hvd.allgather, mixed)
        assert "uint32" in str(err) and "int32" in str(err), err
    for dtype in (tf.uint16, tf.uint32, tf.uint64, tf.bool):
        mine = tf.cast(tf.fill([N, 2], R + 1), dtype)
        for mode, out in in_modes(lambda: hvd.allgather(mine)).items():
            assert out.dtype == dtype and out.shape == (N * N, 2), (mode, dtype, out)
            assert out.numpy().tolist() == tf.cast(tf.repeat(tf.range(1, N + 1), N * 2), dtype).numpy().reshape(
                N * N, 2).tolist(), (mode, dtype, out)
        for mode, out in in_modes(lambda: hvd.broadcast(mine, N - 1)).items():
            assert out.numpy().tolist() == tf.cast(tf.fill([N, 2], N), dtype).numpy().tolist(), (mode, dtype, out)
        for mode, out in in_modes(lambda: hvd.alltoall(mine)).items():
            assert out.numpy().tolist() == tf.cast(tf.reshape(tf.repeat(tf.range(1, N + 1), 2), [N, 2]),
                                                   dtype).numpy().tolist(), (mode, dtype, out)


@check("alltoall with and without splits")
def _():
    rows = tf.reshape(tf.range(N * 2) + 100 * R, [N * 2, 1])
    for mode, out in in_modes(lambda: hvd.alltoall(rows)).items():
        assert not isinstance(out, tuple), mode
        assert out.numpy().ravel().tolist() == [100 * r + 2 * R + i for r in range(N) for i in range(2)], mode
    splits = [1] * N  # rank R sends its j-th row to rank j
    for mode, (out, received) in in_modes(lambda: hvd.alltoall(rows[:N], splits=splits)).items():
        assert out.numpy().ravel().tolist() == [100 * r + R for r in range(N)], mode
        assert received.numpy().tolist() == [1] * N, mode
    out, received = hvd.alltoall(tf.ones((2 * N, 0)), splits=[2] * N)  # rows of no elements: splits still arrive
    assert tuple(out.shape) == (2 * N, 0) and received.numpy().tolist() == [2] * N, (out.shape, received)


@check("alltoall: float splits refused, unsent rows get a zero gradient; allgather of an unknown rank; Horovod's argument orders")
def _():
    expect_error(TypeError, hvd.alltoall, tf.range(float(N)), splits=[1.5] + [0.5] * (N - 1))  # was cut to [1, 0, ...]
    x = tf.Variable(tf.ones([N + 3, 1]))
    with tf.GradientTape() as tape:
        out, _ = hvd.alltoall(x, splits=[1] * N)  # the last 3 rows are not sent
        loss = tf.reduce_sum(out)
    assert tape.gradient(loss, x).numpy().ravel().tolist() == [1.0] * N + [0.0] * 3
    gathered = tf.function(lambda t: tf.reduce_sum(hvd.allgather(t), axis=1),
                           input_signature=[tf.TensorSpec(None, tf.float32)])  # a rank unknown when traced
    assert gathered(tf.ones([2, 3])).numpy().tolist() == [3.0] * (2 * N)
    # Horovod's positional order: grouped_reducescatter(tensors, device_dense, compression, op, process_set).
    (share,) = hvd.grouped_reducescatter([tf.ones([N, 1])], "", hvd.Compression.none, hvd.Sum, hvd.global_process_set)
    assert share.numpy().ravel().tolist() == [float(N)]
    opt = khvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    assert isinstance(opt.variables(), list)  # a method in Keras 2, a list in Keras 3: callable in both
    khvd.PartialDistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                     average_aggregated_gradients=True)
    assert khvd.callbacks.BestModelCheckpoint("val_acc", save_weights_only=True).filepath == "best_model.weights.h5"


@check("a bad argument found while an op runs is InvalidArgumentError (and a ValueError), as Horovod's kernels")
def _():
    if N > 1:
        e = expect_error(tf.errors.InvalidArgumentError, hvd.alltoall, tf.ones([N + 1]))  # rows not a multiple of N
        assert isinstance(e, ValueError) and "multiple" in str(e), e
        # (Inside tf.function TensorFlow's py_func reports any ValueError as InvalidArgumentError already.)
    # XLA has no kernel for the host call: ddl says so when the function is traced, not XLA's
    # "No registered 'PyFunc' OpKernel" when it runs.
    compiled = tf.function(lambda x: hvd.allreduce(x), jit_compile=True)
    e = expect_error(RuntimeError, compiled, tf.ones([2]))
    assert "cannot run inside an XLA-compiled function" in str(e), e


@check("reducescatter: uneven rows (the first rows % size ranks get one more), grouped")
def _():
    rows = 2 * N + 1
    stack = every((rows, 3))
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    start = sum(counts[:R])
    for mode, out in in_modes(lambda: hvd.reducescatter(data(R, (rows, 3)), op=hvd.Sum)).items():
        assert np.array_equal(out.numpy(), stack.sum(0)[start:start + counts[R]]), mode
    for mode, outs in in_modes(lambda: hvd.grouped_reducescatter([data(R, (rows, 3))], op=hvd.Average)).items():
        assert np.allclose(outs[0].numpy(), stack.mean(0)[start:start + counts[R]]), mode
    expect_error(ValueError, hvd.reducescatter, data(R), op=hvd.Max)


@check("gradients of allreduce, allgather, broadcast, alltoall, reducescatter (Horovod's)")
def _():
    x = tf.Variable(tf.ones([N, 2]))
    for mode, wrap in MODES.items():
        def grads():
            with tf.GradientTape(persistent=True) as tape:
                outs = [hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Average), hvd.allgather(x),
                        hvd.broadcast(x, 0), hvd.alltoall(x), hvd.reducescatter(x, op=hvd.Sum)]
                losses = [tf.reduce_sum(o) for o in outs]
            return [tape.gradient(loss, x) for loss in losses]
        g = [t.numpy() for t in wrap(grads)()]
        ones = np.ones([N, 2])
        assert np.allclose(g[0], N * ones), (mode, "allreduce sum", g[0])
        assert np.allclose(g[1], ones), (mode, "allreduce average", g[1])
        assert np.allclose(g[2], ones), (mode, "allgather", g[2])
        assert np.allclose(g[3], ones if R == 0 else 0 * ones), (mode, "broadcast", g[3])
        assert np.allclose(g[4], ones), (mode, "alltoall", g[4])
        assert np.allclose(g[5], N * ones), (mode, "reducescatter sum", g[5])


@check("DistributedGradientTape: one group, op, predivide factor, None kept, sparse_as_dense")
def _():
    w = tf.Variable(tf.fill([2], float(R + 1)))
    unused = tf.Variable(1.0)
    emb = tf.Variable(tf.ones([N, 2]))
    for mode, wrap in MODES.items():
        for kwargs, scale in (({}, 1.0), ({"op": hvd.Sum}, N), ({"gradient_predivide_factor": 2.0}, 1.0),
                              ({"sparse_as_dense": True}, 1.0)):
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, [R]))
                tape = hvd.DistributedGradientTape(tape, **kwargs)
                return tape.gradient(loss, [w, unused, emb])
            gw, gu, ge = wrap(step)()
            mean = np.mean([2 * (r + 1) for r in range(N)])
            assert np.allclose(gw.numpy(), mean * scale), (mode, kwargs, gw)
            assert gu is None, (mode, kwargs)
            assert np.allclose(tf.convert_to_tensor(ge).numpy(), np.ones([N, 2]) * scale / N), (mode, kwargs, ge)


@check("worker-local gradients: register_local_source, get_local_and_global_gradients, PartialDistributedGradientTape")
def _():
    shared = tf.Variable(tf.fill([2], float(R + 1)))
    mine = tf.Variable(tf.fill([3], float(R + 1)))  # each rank's own, as in model parallelism
    mean = np.mean([2 * (r + 1) for r in range(N)])
    for mode, wrap in MODES.items():
        for scale_local in (True, False):
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(shared * shared) + tf.reduce_sum(mine * mine)
                tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale_local)
                tape.register_local_source(mine)
                return tape.gradient(loss, [shared, mine])
            gs, gm = wrap(step)()
            assert np.allclose(gs.numpy(), mean), (mode, gs)
            own = 2 * (R + 1) / (N if scale_local else 1)  # not reduced; divided by the size with scale_local
            assert np.allclose(gm.numpy(), own), (mode, scale_local, gm)
    layers = [tf.keras.layers.Dense(2, kernel_initializer=tf.keras.initializers.Constant(R + 1)),
              tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(R + 1))]
    model = tf.keras.Sequential(layers)
    x = tf.ones([1, 3])
    model(x)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x))
    plain = tape.gradient(loss, model.trainable_weights)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=layers[0])
    local, others = tape.get_local_and_global_gradients(loss, model.trainable_weights)
    assert [id(v) for v, _ in local] == [id(w) for w in layers[0].trainable_weights], local
    assert [id(v) for v, _ in others] == [id(w) for w in layers[1].trainable_weights], others
    for (_, g), p in zip(local, plain[:2]):
        assert np.allclose(g.numpy(), p.numpy() / N), (g, p)
    for (_, g), p in zip(others, plain[2:]):
        reduced = hvd.allreduce(p)
        assert np.allclose(g.numpy(), reduced.numpy()), (g, reduced)
    expect_error(ValueError, hvd.PartialDistributedGradientTape, tf.GradientTape(), local_layers=[mine])


@check("keras: PartialDistributedOptimizer and register_local_var; BroadcastGlobalVariablesCallback(local_variables=)")
def _():
    def model_of(rank):
        m = tf.keras.Sequential([tf.keras.layers.Dense(2, kernel_initializer=tf.keras.initializers.Constant(rank + 1)),
                                 tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(rank + 1))])
        m(tf.ones([1, 3]))
        return m
    x = tf.ones([1, 3])
    model = model_of(R)
    lr = 0.5
    opt = khvd.PartialDistributedOptimizer(tf.keras.optimizers.SGD(lr), local_layers=[model.layers[0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    grads = tape.gradient(loss, model.trainable_weights)
    before = [w.numpy() for w in model.trainable_weights]
    opt.apply_gradients(zip(grads, model.trainable_weights))
    n_local = len(model.layers[0].trainable_weights)
    for i, (w, b, g) in enumerate(zip(model.trainable_weights, before, grads)):
        applied = (g / N).numpy() if i < n_local else hvd.allreduce(g).numpy()  # local: own gradient / size
        assert np.allclose(w.numpy(), b - lr * applied, atol=1e-5), (i, w.numpy(), b, applied)
    expect_error(ValueError, khvd.PartialDistributedOptimizer, tf.keras.optimizers.SGD(lr), local_layers=["dense"])
    # The callback leaves local variables as they are and makes the others the root's.
    model = model_of(R)
    model.compile(optimizer=khvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.0)), loss="mse")
    local_vars = list(model.layers[0].variables)
    callback = khvd.callbacks.BroadcastGlobalVariablesCallback(N - 1, local_variables=local_vars)
    model.fit(np.ones([2, 3], "float32"), np.ones([2, 1], "float32"), batch_size=2, epochs=1, verbose=0,
              callbacks=[callback])
    refs = {id(v) for v in local_vars}
    for v in model.variables:  # kernels start at the owner's rank + 1, biases at 0
        owner = R if id(v) in refs else N - 1
        expected = owner + 1.0 if "kernel" in v.name else 0.0
        assert np.allclose(v.numpy(), expected), (v.name, v.numpy(), owner)
    expect_error(ValueError, khvd.callbacks.BroadcastGlobalVariablesCallback, 0, local_variables=[1.0])


@check("join, barrier, broadcast_object, allgather_object")
def _():
    assert int(hvd.join()) in range(N)
    hvd.barrier()
    assert hvd.broadcast_object({"from": R, "list": [1, 2]}, root_rank=N - 1) == {"from": N - 1, "list": [1, 2]}
    assert hvd.allgather_object(("rank", R)) == [("rank", r) for r in range(N)]


@check("object collectives: a rank whose object does not pickle fails every rank, and the next call pairs right")
def _():
    import threading
    from ddl.common import objects
    last = N - 1
    # Without cloudpickle (the test venvs have none) a lambda does not pickle either.
    for unpicklable in [threading.Lock()] + ([lambda x: x] if objects.pickler.__name__ == "pickle" else []):
        e = expect_error(Exception, hvd.broadcast_object, unpicklable if R == last else None, root_rank=last)
        assert R == last or (isinstance(e, RuntimeError) and f"rank {last} could not serialize" in str(e)), e
        assert hvd.broadcast_object(("second", R), root_rank=last) == ("second", last)
        e = expect_error(Exception, hvd.allgather_object, unpicklable if R == 0 else ("first", R))
        assert R == 0 or (isinstance(e, RuntimeError) and "rank 0 could not serialize" in str(e)), e
        assert hvd.allgather_object(("second", R)) == [("second", r) for r in range(N)]


@check("process sets: ops on a subset, ranks outside refused (InvalidArgumentError), DistributedOptimizer outside it")
def _():
    evens = hvd.add_process_set(list(range(0, N, 2)))
    try:
        if R % 2 == 0:
            out = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum, process_set=evens)
            assert out.numpy().tolist() == [float(sum(range(0, N, 2)))], out
            f = tf.function(lambda: hvd.allgather(tf.constant([R]), process_set=evens))
            assert f().numpy().tolist() == list(range(0, N, 2))
        else:
            # Horovod's kernels: "not a member of the provided process set", an InvalidArgumentError.
            for op in (hvd.allreduce, hvd.allgather, lambda t, process_set: hvd.broadcast(t, 0, process_set=process_set)):
                e = expect_error(tf.errors.InvalidArgumentError, op, tf.constant([1.0]), process_set=evens)
                assert isinstance(e, ValueError) and "is not in" in str(e), e
        # A rank outside the optimizer's set applies its own gradient, unreduced (Horovod's _allreduce_cond).
        v = tf.Variable([float(R)])
        opt = khvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), op=hvd.Sum, process_set=evens)
        opt.apply_gradients([(tf.constant([1.0 + R]), v)])
        expected = float(R) - (sum(1.0 + r for r in range(0, N, 2)) if R % 2 == 0 else 1.0 + R)
        assert v.numpy().tolist() == [expected], (v.numpy(), expected)
    finally:
        hvd.barrier()
        hvd.remove_process_set(evens)


@check("a mismatch across ranks is FailedPreconditionError naming the op (in tf.function: an OpError saying so)")
def _():
    e = expect_error(tf.errors.FailedPreconditionError, lambda: hvd.allreduce(tf.ones([R + 1]), name="mismatch_eager"))
    assert "mismatch_eager" in str(e), e
    # Inside a graph TensorFlow's py_func reports every Python exception as UnknownError: the message keeps
    # the class and the op's name (docs/ddl-tensorflow.md).
    fn = tf.function(lambda: hvd.allreduce(tf.ones([R + 1]), name="mismatch_graph"))
    e = expect_error(tf.errors.OpError, fn)
    assert "FailedPreconditionError" in str(e) and "mismatch_graph" in str(e), e
    expect_error((ValueError, TypeError), hvd.allreduce, tf.constant(["a"]))


@check("names are fixed by the trace: an extra trace on one rank only does not shift the others' names")
def _():
    def body(x):
        return hvd.allreduce(x, op=hvd.Sum)
    if R == 0:
        # Traced (never run) on rank 0 alone, as a retrace after a new input signature would be.
        tf.function(body).get_concrete_function(tf.TensorSpec([2], tf.float32))
        tf.function(body).get_concrete_function(tf.TensorSpec([3], tf.float32))
    f = tf.function(body)
    assert f(tf.ones([2])).numpy().tolist() == [N, N]
    assert f(tf.ones([2])).numpy().tolist() == [N, N]


@check("keras: allreduce/allgather/broadcast on Python values and on tensors in tf.function")
def _():
    assert np.allclose(khvd.allreduce([float(R)]).numpy(), [np.mean(range(N))])
    assert khvd.allgather([R]).numpy().tolist() == list(range(N))
    assert khvd.broadcast([R, R], 0).numpy().tolist() == [0, 0]
    in_graph = tf.function(lambda t: khvd.allreduce(t, op=hvd.Sum))  # a symbolic tensor, not a Python value
    assert in_graph(tf.constant([1.0])).numpy().tolist() == [float(N)]


def small_model():
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                tf.keras.layers.Dense(1)])


def weights_identical(model):
    mine = np.concatenate([v.numpy().ravel() for v in model.variables])
    return all(np.array_equal(mine, other) for other in hvd.allgather_object(mine))


@check("keras: fit with DistributedOptimizer, the callbacks, warmup formula, metric averages, load_model")
def _():
    tf.random.set_seed(R)  # different initial weights: the broadcast callback aligns them
    x = np.random.RandomState(R).rand(64, 4).astype("float32")
    y = x.sum(1, keepdims=True) * (R + 1)  # each rank's loss differs
    model = small_model()
    lr = 0.01
    model.compile(optimizer=khvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr)), loss="mse")
    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(dict(logs))

    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[
        khvd.callbacks.BroadcastGlobalVariablesCallback(0), khvd.callbacks.MetricAverageCallback(),
        khvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2, verbose=0), Record()])
    assert weights_identical(model)
    losses = hvd.allgather_object(history.history["loss"])
    assert all(np.allclose(losses[0], other) for other in losses), losses  # averaged over ranks
    steps = 4
    for epoch, logs in enumerate(seen[:2]):
        e = epoch + (steps - 1) / steps + 1.0 / steps  # the last batch's epoch, as Horovod computes it
        expected = lr / N * (e * (N - 1) / 2 + 1)
        assert np.isclose(logs["lr"], expected, rtol=1e-5), (epoch, logs["lr"], expected)
    # An optimizer whose learning rate is a schedule: the callback cannot set it (Keras 3 would ignore
    # the value, Keras 2 replace the schedule for good), and says so rather than do either silently.
    scheduled = small_model()
    decay = tf.keras.optimizers.schedules.ExponentialDecay(lr, 1000, 0.99)
    scheduled.compile(optimizer=khvd.DistributedOptimizer(tf.keras.optimizers.SGD(decay)), loss="mse")
    e = expect_error(ValueError, scheduled.fit, x, y, batch_size=16, epochs=1, verbose=0,
                     callbacks=[khvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2)])
    assert "ExponentialDecay" in str(e), e
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        loaded = khvd.load_model(path)
        assert type(loaded.optimizer).__name__ == "SGD" and loaded.optimizer._ddl_distributed
        loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert weights_identical(loaded)


@check("keras: backward_passes_per_step=2 applies every second step; iterations count every step")
def _():
    model = small_model()
    hvd.broadcast_variables(model.variables, 0)
    opt = khvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), backward_passes_per_step=2,
                                    average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    x = np.random.RandomState(R).rand(32, 4).astype("float32")
    before = [v.numpy().copy() for v in model.trainable_variables]
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)  # 2 steps: one update
    assert int(opt.iterations.numpy()) == 2
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
    assert weights_identical(model)


@check("keras: LearningRateScheduleCallback with a number decays by it each epoch from start_epoch (Horovod's code)")
def _():
    model = small_model()
    model.compile(optimizer=khvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0)), loss="mse")
    rates = []
    record = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: rates.append(round(float(model.optimizer.learning_rate.numpy()), 6)))
    schedule = khvd.callbacks.LearningRateScheduleCallback(initial_lr=1.0, multiplier=0.5, start_epoch=1)
    x = np.ones((4, 4), "float32")
    model.fit(x, x[:, :1], batch_size=2, epochs=4, verbose=0, callbacks=[schedule, record])
    assert rates == [1.0, 1.0, 0.5, 0.25], rates  # a constant 0.5 from epoch 1 on, before


@check("keras: backward_passes_per_step=2 leaves a variable without a gradient alone, as 1 does")
def _():
    used, unused = tf.Variable([1.0]), tf.Variable([1.0])
    opt = khvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, weight_decay=0.5), backward_passes_per_step=2)
    for _ in range(4):  # two updates
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(used * used)  # `unused` takes no part: its gradient is None
        opt.apply_gradients(zip(tape.gradient(loss, [used, unused]), [used, unused]))
    assert unused.numpy()[0] == 1.0, unused.numpy()  # weight decay moved it (0.9025) when it got zeros
    assert used.numpy()[0] < 1.0


@check("keras: SyncBatchNormalization uses the global batch's statistics")
def _():
    x = tf.constant(np.random.RandomState(R).rand(8, 3).astype("float32") + R)
    layer = khvd.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    out = layer(x, training=True)
    everyone = np.concatenate([np.random.RandomState(r).rand(8, 3).astype("float32") + r for r in range(N)])
    mean, var = everyone.mean(0), everyone.var(0)
    assert np.allclose(out.numpy(), (x.numpy() - mean) / np.sqrt(var + 1e-3), atol=1e-4)


@check("keras: SyncBatchNormalization of conv (4-D) inputs uses the global batch's statistics too")
def _():
    # Keras 2 picked its fused kernel for 4-D inputs, which knows only this rank's batch.
    x = tf.constant(np.random.RandomState(R).rand(2, 3, 3, 2).astype("float32") + R)
    layer = khvd.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    out = layer(x, training=True)
    everyone = np.concatenate([np.random.RandomState(r).rand(2, 3, 3, 2).astype("float32") + r for r in range(N)])
    mean, var = everyone.mean((0, 1, 2)), everyone.var((0, 1, 2))
    assert np.allclose(out.numpy(), (x.numpy() - mean) / np.sqrt(var + 1e-3), atol=1e-4)
    assert np.allclose(layer.moving_mean.numpy(), mean, atol=1e-5), (layer.moving_mean.numpy(), mean)


@check("keras: SyncBatchNormalization keeps the variance of inputs far from zero, its gradients, and an empty rank")
def _():
    # Mean 1e4 against a spread of 1: a variance from sums of x and x^2 in float32 is lost.
    rs = np.random.RandomState(5)
    everyone = rs.randn(8 * N, 3) + np.array([1e4, -3e3, 0.5])
    rows = 8 if R < N - 1 or N == 1 else 0  # the last rank brings an empty batch
    brought = everyone[:8 * (N - 1) or 8]
    weights = np.arange(brought.size, dtype="float64").reshape(-1, 3) / 10
    mine = tf.constant(brought[8 * R:8 * R + rows].astype("float32"))
    layer = khvd.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    layer.build((None, 3))

    @tf.function
    def in_a_graph(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, training=True)
            loss = tf.reduce_sum(out * w)
        return out, tape.gradient(loss, x)

    whole = tf.constant(brought.astype("float32").astype("float64"))  # the same float32 values, in float64
    with tf.GradientTape() as tape:
        tape.watch(whole)
        mean, var = tf.nn.moments(whole, axes=[0])
        ref = (whole - mean) / tf.sqrt(var + 1e-3)
        ref_loss = tf.reduce_sum(ref * weights)
    ref_grad = tape.gradient(ref_loss, whole).numpy()[8 * R:8 * R + rows]
    for run in (in_a_graph, in_a_graph.python_function):
        out, grad = run(mine, tf.constant(weights[8 * R:8 * R + rows].astype("float32")))
        assert out.shape == (rows, 3) and grad.shape == (rows, 3)
        if rows:
            # float32 holds 1e4 to ~1e-3: the normalized values can be as far off as that, no further.
            assert np.abs(out.numpy() - ref.numpy()[8 * R:8 * R + rows]).max() < 1e-2, (out.numpy(), ref.numpy())
            assert np.abs(grad.numpy() - ref_grad).max() < 1e-1, (grad.numpy(), ref_grad)
    assert np.allclose(layer.moving_variance.numpy(), var.numpy(), rtol=1e-2), (layer.moving_variance.numpy(), var.numpy())


@check("a custom tf.function loop with DistributedGradientTape trains identical replicas")
def _():
    tf.random.set_seed(10 + R)
    model = small_model()
    opt = tf.keras.optimizers.Adam(0.01)
    x = np.random.RandomState(R).rand(16, 4).astype("float32")

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - 1.0) ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables if not callable(opt.variables) else opt.variables(), root_rank=0)
        return loss

    for i in range(5):
        step(i == 0)
    assert weights_identical(model)


@check("eagerly, a call only one rank cannot make still takes its place: the others fail with its reason, the next ops pair right")
def _():
    # Last but one: the ranks create different eager tensors here, whose ids name the tensors a later
    # tf.function captures, and so the unnamed graph ops made of them (_graph_name).
    if N < 2:
        return
    last = R == N - 1  # the rank whose arguments are wrong
    complex_or_real = tf.ones([2], tf.complex64) if last else tf.ones([2])
    bad_calls = [  # (what, the call on every rank; the last rank's arguments fail its own checks)
        ("allreduce of a dtype libddl lacks", lambda: hvd.allreduce(complex_or_real, op=hvd.Sum)),
        ("allgather of a dtype that cannot move", lambda: hvd.allgather(complex_or_real)),
        ("alltoall with splits that do not fit", lambda: hvd.alltoall(tf.ones([N]), splits=[N + 1] + [0] * (N - 1) if last else None)),
        ("alltoall with splits that are not integers", lambda: hvd.alltoall(tf.ones([N]), splits=[0.5] * N if last else [1] * N)),
        ("broadcast from a root outside the set", lambda: hvd.broadcast(tf.ones([2]), N if last else 0)),
        ("reducescatter of a scalar", lambda: hvd.reducescatter(tf.ones([]) if last else tf.ones([N]))),
        ("grouped_allreduce with one bad part", lambda: hvd.grouped_allreduce([tf.ones([1]), complex_or_real, tf.ones([1])])),
    ]
    for what, call in bad_calls:
        err = expect_error((ValueError, TypeError), call)  # TypeError: the splits' dtype, as Horovod's
        if not last:
            assert f"failed on rank {N - 1}" in str(err), (what, str(err))
        summed = hvd.allreduce(tf.fill([2], 100.0 * (R + 1)), op=hvd.Sum)
        assert summed.numpy().tolist() == [100.0 * N * (N + 1) / 2] * 2, (what, summed)
        gathered = hvd.allgather(tf.fill([1], float(R)))
        assert gathered.numpy().tolist() == [float(r) for r in range(N)], (what, gathered)
    # A named call refused on this rank takes no place: its name is free again at once.
    for step in range(5):
        expect_error(ValueError, hvd.allreduce, tf.ones([2], tf.complex64), name=f"retry.{step}")
        assert hvd.allreduce(tf.ones([2]), name=f"retry.{step}", op=hvd.Sum).numpy().tolist() == [N, N]


@check("unnamed grouped allreduces of different sizes fail on every rank; later unnamed ops fail at once; init mends")
def _():
    # Rank r groups r + 1 tensors: rank 0's one tensor paired with another rank's first, silently.
    err = expect_error(tf.errors.FailedPreconditionError, hvd.grouped_allreduce, [tf.ones([1]) * (R + 1)] * (R + 1))
    assert "differs between ranks" in str(err) and "group of" in str(err), err
    err = expect_error(tf.errors.FailedPreconditionError, hvd.allreduce, tf.ones([2]))  # the first failure's kind
    assert "out of step since an earlier one failed" in str(err), err
    assert np.array_equal(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="named.after.broken").numpy(), [N, N])
    hvd.shutdown()
    hvd.init()
    assert np.array_equal(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), [N, N])


print(f"checks done, {len(failures)} failed", flush=True)
hvd.shutdown()
