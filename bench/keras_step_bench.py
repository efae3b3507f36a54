"""The Horovod Keras tutorial's CNN (examples/keras_horovod.py's model): model.fit step time with
ddl.keras's DistributedOptimizer under `ddl run` against tf.distribute.MultiWorkerMirroredStrategy
(RING collectives, workers on localhost) and, when its venv exists (bench/horovod_venv.sh tensorflow),
real Horovod 0.28.1 on the same TensorFlow 2.15 under horovodrun --gloo, side by side in one run, on
N ranks; and the latency of a one-float allreduce inside tf.function (hvd.allreduce against the
strategy's replica all_reduce).

    python3 bench/keras_step_bench.py --ranks 2 4 [--python $(bash scripts/tf_venv.sh keras2 --python)]

Each figure is the median step (or op) time of one run after warm-up; --repeats alternates the
contenders and keeps each one's fastest run, since this machine is noisy. Prints a table and the
ratios (MWMS time / ddl time: above 1 means ddl is faster).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DDL = os.path.join(ROOT, "build", "cli", "ddl")
PACKAGE = os.path.join(ROOT, "build", "python")


# ---- the worker (one process of either contender) ----

def build_model(tf):
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    images = np.random.RandomState(0).rand(args.batch * args.steps, 28, 28, 1).astype("float32")
    labels = np.random.RandomState(1).randint(0, 10, args.batch * args.steps)
    times = []

    class Timer(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    if args.worker in ("ddl", "horovod"):
        import importlib
        hvd = importlib.import_module("ddl.tensorflow.keras" if args.worker == "ddl" else "horovod.tensorflow.keras")
        hvd.init()
        rank, ranks = hvd.rank(), hvd.size()
        model = build_model(tf)
        model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                      loss="sparse_categorical_crossentropy")
        data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch)
        model.fit(data, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Timer()])

        x = tf.constant([1.0])

        # Each op takes the last one's result: a chain, so every op's latency counts once (unused
        # results could be pruned from the graph, or run concurrently and fused).
        @tf.function
        def one_float(n):
            y = x
            for _ in tf.range(n):
                y = hvd.allreduce(y, op=hvd.Average, name="one_float")
            return hvd.allreduce(y, op=hvd.Average, name="one_float")

        # The op through each one's TensorFlow API (horovod.tensorflow.keras.allreduce evaluates through a session).
        hvd = importlib.import_module("ddl.tensorflow" if args.worker == "ddl" else "horovod.tensorflow")

        one_float(tf.constant(10))
        start = time.perf_counter()
        one_float(tf.constant(args.ops))
        op_time = (time.perf_counter() - start) / (args.ops + 1)
    else:
        cluster = json.loads(os.environ["TF_CONFIG"])
        rank, ranks = cluster["task"]["index"], len(cluster["cluster"]["worker"])
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        with strategy.scope():
            model = build_model(tf)
            model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch * ranks)  # global batch
        no_shard = tf.data.Options()
        no_shard.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        model.fit(data.with_options(no_shard).take(args.steps), epochs=1, verbose=0, callbacks=[Timer()])

        @tf.function
        def one_float(n):
            def step(prev):
                ctx = tf.distribute.get_replica_context()
                v = tf.ones([1]) * prev  # made in the replica's context, where the strategy places it
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, v) / ctx.num_replicas_in_sync
            y = tf.ones([1])
            for _ in tf.range(n):
                y = strategy.run(lambda: step(y))  # a chain, as for ddl and Horovod above
            return strategy.run(lambda: step(y))

        one_float(tf.constant(10))
        start = time.perf_counter()
        one_float(tf.constant(args.ops))
        op_time = (time.perf_counter() - start) / (args.ops + 1)
    if rank == 0:
        steady = times[args.warmup:] or times
        print("RESULT " + json.dumps({"step_ms": 1000 * statistics.median(steady), "op_us": 1e6 * op_time}), flush=True)


# ---- the driver ----

def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def result_of(output):
    for line in output.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError("no result:\n" + output[-3000:])


def run_ddl(args, ranks):
    env = {**os.environ, "PYTHONPATH": PACKAGE, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [DDL, "run", "-np", str(ranks), "--", args.python, __file__, "--worker", "ddl", *worker_flags(args)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-3000:])
    return result_of(out.stdout)


def run_horovod(args, ranks):
    horovodrun = os.path.join(os.path.dirname(args.horovod_python), "horovodrun")
    cmd = [horovodrun, "-np", str(ranks), "--gloo", "-H", f"localhost:{ranks}", args.horovod_python, __file__,
           "--worker", "horovod", *worker_flags(args)]
    out = subprocess.run(cmd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True,
                         timeout=900)
    if out.returncode:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-3000:])
    return result_of(out.stdout)


def run_mwms(args, ranks):
    ports = free_ports(ranks)
    workers = [f"localhost:{p}" for p in ports]
    procs = []
    for i in range(ranks):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        env = {**os.environ, "TF_CONFIG": tf_config, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([args.python, __file__, "--worker", "mwms", *worker_flags(args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("\n".join(o[1][-3000:] for o in outs))
    return result_of(outs[0][0])


def worker_flags(args):
    return ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--ops", str(args.ops)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["ddl", "mwms", "horovod"], help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--python", default="/var/cache/ddl/tf-keras2-venv/bin/python")
    parser.add_argument("--horovod-python", default="/var/cache/ddl/horovod-tf-venv/bin/python",
                        help="the Python of bench/horovod_venv.sh tensorflow (left out when missing)")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(f"Keras CNN, batch {args.batch} per rank, {args.steps} steps (median after {args.warmup}); "
          f"one-float allreduce in tf.function x {args.ops}; fastest of {args.repeats} alternating runs; {args.python}")
    contenders = [("ddl", run_ddl), ("MWMS", run_mwms)]
    if os.path.exists(os.path.join(os.path.dirname(args.horovod_python), "horovodrun")):
        contenders.append(("Horovod", run_horovod))
    else:
        print(f"(no Horovod: {args.horovod_python} has no horovodrun; make it with bench/horovod_venv.sh tensorflow)")
    print("ranks  contender   step ms  step (its/ddl)   1-float allreduce us  (its/ddl)")
    for ranks in args.ranks:
        best = {}
        for _ in range(args.repeats):
            for name, fn in contenders:
                r = fn(args, ranks)
                b = best.get(name)
                best[name] = r if b is None else {k: min(b[k], r[k]) for k in r}
        d = best["ddl"]
        for name, _ in contenders:
            r = best[name]
            print(f"{ranks:>5}  {name:<9} {r['step_ms']:>8.2f}  {r['step_ms'] / d['step_ms']:>13.2f}   "
                  f"{r['op_us']:>20.1f}  {r['op_us'] / d['op_us']:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
