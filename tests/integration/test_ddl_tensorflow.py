"""ddl.tensorflow and ddl.keras (Horovod's TensorFlow 2 and Keras APIs over libddl) from real
TensorFlow under `ddl run`: every check of tf_api_checks.py on 2 and 3 ranks with TensorFlow 2.15
(Keras 2) and TensorFlow 2.21 (Keras 3), the example scripts, and failures that must reach every rank.
The two interpreters are the venvs of scripts/tf_venv.sh (tensorflow-cpu from PyPI: Debian has no
TensorFlow); the test command makes them, so a missing one is a failure, not a skip."""
import os
import textwrap
import unittest

from ddl_testing import ddl, lines_by_rank

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "..")
BUILD_DIR = os.environ.get("DDL_BUILD_DIR", os.path.join(SOURCE, "build"))
PACKAGE = os.path.join(BUILD_DIR, "python")
CHECKS = os.path.join(HERE, "tf_api_checks.py")
with open(CHECKS) as checks_file:  # every rank must run each of them: a check that never ran is a failure too
    CHECK_COUNT = sum(line.startswith("@check(") for line in checks_file)
PYTHONS = {
    "keras2": os.environ.get("DDL_TF_KERAS2_PYTHON", "/var/cache/ddl/tf-keras2-venv/bin/python"),
    "keras3": os.environ.get("DDL_TF_KERAS3_PYTHON", "/var/cache/ddl/tf-keras3-venv/bin/python"),
}


def python_of(test, flavour):
    python = PYTHONS[flavour]
    if not os.access(python, os.X_OK):
        test.fail(f"{python} is missing: run `bash scripts/tf_venv.sh {flavour}` (scripts/test.sh does)")
    return python


def run_python(test, flavour, np, code_or_file, *args, env=None, timeout=600):
    """A Python worker under `ddl run -np NP` with the build tree's ddl package and TensorFlow `flavour`."""
    program = [code_or_file] if os.path.exists(code_or_file) else ["-c", textwrap.dedent(code_or_file)]
    env = {"PYTHONPATH": f"{PACKAGE}:{HERE}", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return ddl("-np", str(np), "--", python_of(test, flavour), *program, *args, env=env, timeout=timeout)


class ApiChecks(unittest.TestCase):
    def check_on(self, flavour, np):
        result = run_python(self, flavour, np, CHECKS, env={"DDL_TIMEOUT": "60"})
        by_rank = lines_by_rank(result.stdout)
        failed = [line for r in range(np) for line in by_rank.get(r, []) if line.startswith("FAIL")]
        self.assertEqual(failed, [], result.stdout[-6000:] + result.stderr[-2000:])
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        for r in range(np):
            oks = [line for line in by_rank[r] if line.startswith("ok ")]
            self.assertEqual(len(oks), CHECK_COUNT, by_rank[r])  # every check of tf_api_checks.py
            self.assertEqual(by_rank[r][-1], "checks done, 0 failed")

    def test_every_check_on_2_ranks_with_keras_2(self):
        self.check_on("keras2", 2)

    def test_every_check_on_3_ranks_with_keras_2(self):
        self.check_on("keras2", 3)

    def test_every_check_on_2_ranks_with_keras_3(self):
        self.check_on("keras3", 2)

    def test_every_check_on_3_ranks_with_keras_3(self):
        self.check_on("keras3", 3)


class Examples(unittest.TestCase):
    """The Horovod tutorials' two shapes: model.fit with the callbacks, and a tf.function loop."""

    def assert_identical_replicas(self, result):
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertRegex(lines_by_rank(result.stdout)[0][-1], r"^replicas identical: yes \(sha256 [0-9a-f]{16}\)$")

    def test_keras_fit_example_on_both_kerases(self):
        for flavour in PYTHONS:
            with self.subTest(flavour):
                result = run_python(self, flavour, 2, os.path.join(SOURCE, "examples", "keras_horovod.py"),
                                    "--epochs", "2", "--samples", "512")
                self.assert_identical_replicas(result)
                self.assertIn("finished gradual learning rate warmup", result.stdout)

    def test_tf_function_loop_example_on_both_kerases(self):
        for flavour in PYTHONS:
            with self.subTest(flavour):
                result = run_python(self, flavour, 2, os.path.join(SOURCE, "examples", "tensorflow_horovod.py"),
                                    "--steps", "20")
                self.assert_identical_replicas(result)


class MixedPrecision(unittest.TestCase):
    """Under a mixed_float16 policy model.compile wraps the DistributedOptimizer in Keras'
    LossScaleOptimizer, which skips a step whose gradients are not finite. Rank 1's targets are
    ten times rank 0's, so its scaled gradients overflow on steps where rank 0's do not: the ranks
    must still apply or skip every step together (they went apart, or one hung, when each decided
    from its own gradients)."""

    FIT = """
        import numpy as np, tensorflow as tf
        import ddl.keras as hvd
        hvd.init()
        R = hvd.rank()
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        x = np.random.RandomState(R).rand(64, 4).astype("float32")
        y = x.sum(1, keepdims=True) * (1 + 9 * R)
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        scale = model.optimizer.dynamic_scale if hasattr(model.optimizer, "dynamic_scale") else model.optimizer.loss_scale
        weights = sum(float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in model.trainable_variables)
        print(f"scale {float(scale)} weights {weights:.9f}", flush=True)
    """

    def test_every_rank_applies_or_skips_each_step_together_on_both_kerases(self):
        for flavour in PYTHONS:
            with self.subTest(flavour):
                result = run_python(self, flavour, 2, self.FIT, env={"DDL_TIMEOUT": "30"}, timeout=300)
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
                by_rank = lines_by_rank(result.stdout)
                self.assertEqual(by_rank[0][-1], by_rank[1][-1], "the replicas or their loss scales differ")
                scale = float(by_rank[0][-1].split()[1])
                self.assertLess(scale, 2 ** 15, "no step was skipped: the test did not reach what it checks")


class FailuresReachEveryRank(unittest.TestCase):
    def test_a_rank_that_dies_mid_step_fails_the_run_with_its_code(self):
        result = run_python(self, "keras3", 2, """
            import os, tensorflow as tf, ddl.tensorflow as hvd
            hvd.init()
            step = tf.function(lambda x: hvd.allreduce(x, name="grad"))
            for i in range(1000):
                if hvd.rank() == 1 and i == 5:
                    os._exit(17)
                step(tf.ones([1000]))
        """, env={"DDL_TIMEOUT": "20"}, timeout=300)
        self.assertEqual(result.returncode, 17, result.stderr[-2000:])
        self.assertIn("rank 1", result.stderr)

    def test_an_op_one_rank_never_submits_is_an_error_on_the_other_within_ddl_timeout(self):
        result = run_python(self, "keras2", 2, """
            import time, tensorflow as tf, ddl.tensorflow as hvd
            hvd.init()
            if hvd.rank() == 1:
                time.sleep(15)  # alive, but submitting nothing, while rank 0's two ops time out
            else:
                try:
                    tf.function(lambda: hvd.allreduce(tf.ones([4]), name="lonely"))()
                    print("no error", flush=True)
                except tf.errors.OpError as e:
                    print("error:", type(e).__name__, "lonely" in str(e), "timed out" in str(e), flush=True)
                try:
                    hvd.allreduce(tf.ones([4]), name="lonely_eager")
                    print("no error", flush=True)
                except hvd.HorovodInternalError as e:
                    print("eager error:", isinstance(e, tf.errors.UnknownError), "lonely_eager" in str(e), flush=True)
        """, env={"DDL_TIMEOUT": "3"}, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        self.assertEqual(lines_by_rank(result.stdout)[0],
                         ["error: UnknownError True True", "eager error: True True"])

    def test_collectives_a_session_graph_runs_in_different_orders_time_out_with_advice(self):
        # TensorFlow 1 style: a Session may start independent collectives in any order on each rank,
        # and each waits for its peers on an executor thread. Here the graph itself orders them
        # differently on the two ranks, so they always meet the timeout; the error says what to do.
        result = run_python(self, "keras2", 2, """
            import tensorflow as tf, ddl.tensorflow as hvd
            hvd.init()
            g = tf.Graph()
            with g.as_default():
                first, second = ("a", "b") if hvd.rank() == 0 else ("b", "a")
                x = hvd.allreduce(tf.ones([2]), name=first)
                with tf.control_dependencies([x]):
                    y = hvd.allreduce(tf.ones([2]), name=second)
                try:
                    with tf.compat.v1.Session(graph=g) as session:
                        session.run(y)
                    print("no error", flush=True)
                except tf.errors.OpError as e:
                    print("error:", "timed out" in str(e), "tf.control_dependencies" in str(e), "TF_NUM_INTEROP_THREADS" in str(e),
                          flush=True)
        """, env={"DDL_TIMEOUT": "3"}, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("error: True True True", by_rank[0] + by_rank[1], result.stdout)

    # Many independent collectives in one Session graph, whose inputs are ready in opposite orders on
    # the two ranks (rank 0 first computes the input of op 0, rank 1 that of the last op): each rank
    # starts the collectives it has inputs for, and each waits for its peers on an inter-op thread.
    # With one thread per core (the default, 2 here) the ranks filled their threads with different
    # ops and every run stalled until DDL_TIMEOUT (Horovod's own test_tensorflow.py met this in its
    # "fused" tests: one stall after another, for minutes). ddl.tensorflow gives the pool 64 threads
    # unless the user chose a size, and keeps the user's choice.
    INDEPENDENT = """
        import os, sys, time, numpy as np, tensorflow as tf, ddl.tensorflow as hvd
        hvd.init()
        r, n, ops = hvd.rank(), hvd.size(), 24
        print("inter-op threads", os.environ["TF_NUM_INTEROP_THREADS"], flush=True)
        if len(sys.argv) > 1:
            sys.exit(0)  # only the pool's size was asked
        g = tf.Graph()
        with g.as_default():
            outs = []
            for k in range(ops):
                wait = (k if r == 0 else ops - 1 - k) * 0.02
                x = tf.numpy_function(lambda w=wait, k=k: (time.sleep(w), np.full([3], float(r + k), np.float32))[1],
                                      [], tf.float32, stateful=True)
                if k % 2:
                    outs.append(hvd.allgather(x, name=f"gather.{k}"))
                else:
                    outs.append(hvd.allreduce(x, name=f"reduce.{k}", op=hvd.Sum))
            with tf.compat.v1.Session(graph=g) as session:
                for step in range(3):
                    values = session.run(outs)
        right = all((values[k] == (np.concatenate([np.full([3], q + k) for q in range(n)]) if k % 2 else
                                   np.full([3], sum(q + k for q in range(n))))).all() for k in range(ops))
        print("results right", right, flush=True)
    """

    def test_a_session_graph_with_more_independent_collectives_than_cores_runs_without_a_stall(self):
        for flavour, np_ in (("keras2", 2), ("keras3", 3)):
            with self.subTest(flavour=flavour, ranks=np_):
                result = run_python(self, flavour, np_, self.INDEPENDENT, env={"DDL_TIMEOUT": "15", "TF_NUM_INTEROP_THREADS": None},
                                    timeout=300)
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
                threads = max(os.cpu_count(), 64)
                for r in range(np_):
                    self.assertEqual(lines_by_rank(result.stdout)[r], [f"inter-op threads {threads}", "results right True"])

    def test_a_users_own_inter_op_thread_count_is_kept(self):
        result = run_python(self, "keras2", 2, self.INDEPENDENT, "size-only", env={"TF_NUM_INTEROP_THREADS": "3"})
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertEqual(lines_by_rank(result.stdout)[1], ["inter-op threads 3"])

    def test_a_session_graph_runs_the_nodes_of_one_grouped_allreduce_in_build_order(self):
        # IndexedSlices are allgathered (values, indices) beside the dense group: five nodes built by one
        # call, which a Session could otherwise start in different orders on the two ranks.
        result = run_python(self, "keras2", 2, """
            import tensorflow as tf, ddl.tensorflow as hvd
            hvd.init()
            r, n = hvd.rank(), hvd.size()
            g = tf.Graph()
            with g.as_default():
                slices = [tf.IndexedSlices(tf.fill([1, 2], float(r + k)), tf.constant([r]), tf.constant([n, 2]))
                          for k in (1, 2)]
                out = hvd.grouped_allreduce(slices + [tf.fill([2], float(r))], op=hvd.Sum)
                nodes = [op for op in g.get_operations() if op.type == "PyFunc"]
                chained = all(nodes[i - 1] in nodes[i].control_inputs for i in range(1, len(nodes)))
                with tf.compat.v1.Session(graph=g) as session:
                    for _ in range(5):
                        a, b, dense = session.run([tf.convert_to_tensor(out[0]), tf.convert_to_tensor(out[1]), out[2]])
            print("nodes", len(nodes), "chained", chained, flush=True)
            print(a.tolist() == [[q + 1.0] * 2 for q in range(n)], b.tolist() == [[q + 2.0] * 2 for q in range(n)],
                  dense.tolist() == [n * (n - 1) / 2] * 2, flush=True)
        """, env={"DDL_TIMEOUT": "20"}, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        for r in (0, 1):
            self.assertEqual(lines_by_rank(result.stdout)[r], ["nodes 5 chained True", "True True True"])


if __name__ == "__main__":
    unittest.main()
