"""ddl.torch (Horovod's PyTorch API over libddl) from real PyTorch under `ddl run`: every check of
torch_api_checks.py on 2 and 3 ranks, Horovod's environment variables, failures that must reach
every rank, and the package installed by `cmake --install`."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from ddl_testing import PYTHON, ddl, lines_by_rank

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.environ.get("DDL_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
PACKAGE = os.path.join(BUILD_DIR, "python")
CHECKS = os.path.join(HERE, "torch_api_checks.py")


def run_python(np, code_or_file, env=None, timeout=300):
    """Runs a Python worker under `ddl run -np NP` with the build tree's ddl package."""
    args = [code_or_file] if os.path.exists(code_or_file) else ["-c", textwrap.dedent(code_or_file)]
    return ddl("-np", str(np), "--", PYTHON, *args, env={"PYTHONPATH": PACKAGE, **(env or {})}, timeout=timeout)


class ApiChecks(unittest.TestCase):
    def check_on(self, np, fastpath="compiled"):
        env = {"DDL_TEST_EXPECT_FASTPATH": fastpath}
        if fastpath == "ctypes":
            env["DDL_PYTHON_FASTPATH"] = "0"
        result = run_python(np, CHECKS, env=env)
        by_rank = lines_by_rank(result.stdout)
        failed = [line for r in range(np) for line in by_rank.get(r, []) if line.startswith("FAIL")]
        self.assertEqual(failed, [], result.stdout[-4000:] + result.stderr[-2000:])
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        for r in range(np):
            oks = [line for line in by_rank[r] if line.startswith("ok ")]
            self.assertGreaterEqual(len(oks), 18, by_rank[r])
            self.assertEqual(by_rank[r][-1], "checks done, 0 failed")

    def test_every_check_on_2_ranks(self):
        self.check_on(2)

    def test_every_check_on_3_ranks(self):
        self.check_on(3)

    def test_every_check_on_2_ranks_through_ctypes_only(self):
        # The fallback where ddl/_fastpath is not built (no Python headers) or does not load.
        self.check_on(2, fastpath="ctypes")


class HorovodExample(unittest.TestCase):
    def test_the_tutorial_script_trains_and_ends_with_identical_replicas(self):
        example = os.path.join(HERE, "..", "..", "examples", "pytorch_horovod.py")
        for extra in ([], ["--fp16-allreduce"]):
            result = ddl("-np", "2", "--", PYTHON, example, "--epochs", "2", *extra, env={"PYTHONPATH": PACKAGE},
                         timeout=300)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            lines = lines_by_rank(result.stdout)[0]
            self.assertRegex(lines[-1], r"^replicas identical: yes \(sha256 [0-9a-f]{16}\)$")
            accuracy = float(lines[-2].rsplit("accuracy ", 1)[1].rstrip("%"))
            self.assertGreater(accuracy, 90.0, lines)


class HorovodEnvironment(unittest.TestCase):
    def test_ranks_match_horovodrun_variables(self):
        result = run_python(3, """
            import os, ddl.torch as hvd
            hvd.init()
            print(hvd.rank(), os.environ["HOROVOD_RANK"], hvd.size(), os.environ["HOROVOD_SIZE"],
                  hvd.local_rank(), os.environ["HOROVOD_LOCAL_RANK"], os.environ["HOROVOD_CROSS_SIZE"])
        """)
        self.assertEqual(result.returncode, 0, result.stderr)
        by_rank = lines_by_rank(result.stdout)
        for r in range(3):
            self.assertEqual(by_rank[r], [f"{r} {r} 3 3 {r} {r} 1"])

    def test_a_bad_horovod_variable_is_named_as_the_user_set_it(self):
        result = run_python(1, "import ddl.torch as hvd; hvd.init()", env={"HOROVOD_CYCLE_TIME": "abc"})
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("HOROVOD_CYCLE_TIME='abc' is not a non-negative number", result.stderr)
        self.assertNotIn("DDL_CYCLE_TIME_MS", result.stderr)

    def test_horovod_timeline_variable_is_an_alias_of_ddl_timeline(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "timeline.json")
            result = run_python(2, """
                import torch, ddl.torch as hvd
                hvd.init()
                hvd.allreduce(torch.ones(4), name="aliased")
                hvd.shutdown()
            """, env={"HOROVOD_TIMELINE": path})
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(path) as f:
                trace = json.load(f)
            names = {e.get("args", {}).get("op") for e in trace["traceEvents"]}
            self.assertIn("allreduce.aliased", names)


class FailuresReachEveryRank(unittest.TestCase):
    def test_an_op_one_rank_never_submits_fails_everywhere_within_ddl_timeout(self):
        start = time.monotonic()
        result = run_python(2, """
            import torch, ddl.torch as hvd
            hvd.init()
            try:
                if hvd.rank() == 0:
                    hvd.allreduce(torch.ones(2), name="only.rank0")
                else:
                    hvd.broadcast(torch.ones(2), 0, name="only.rank1")
                print("no error")
            except hvd.HorovodInternalError as e:
                print("HorovodInternalError:", e)
        """, env={"DDL_TIMEOUT": "3"}, timeout=120)
        elapsed = time.monotonic() - start
        self.assertEqual(result.returncode, 0, result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("allreduce.only.rank0", by_rank[0][0])
        self.assertIn("never submitted", by_rank[0][0])
        self.assertTrue(by_rank[1][0].startswith("HorovodInternalError:"), by_rank[1])
        self.assertLess(elapsed, 60)

    def test_a_rank_late_past_the_timeout_gets_an_error_not_another_step_s_sum(self):
        # Ranks 0 and 2 catch step 0's timeout and go on; rank 1, asleep through it, then submits
        # step 0's "grad": it paired with the others' step 1, and every step after was a step apart
        # on every rank, without an error. The sync and async calls, and broadcast_object.
        result = run_python(3, """
            import time, torch, ddl.torch as hvd
            hvd.init()
            r, n = hvd.rank(), hvd.size()
            calls = {
                "sync": lambda t: hvd.allreduce(t, op=hvd.Sum, name="grad"),
                "async": lambda t: hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum, name="grad.async")),
            }
            for kind, call in calls.items():
                for step in range(3):
                    if r == 1 and step == 0:
                        time.sleep(7.5)  # past DDL_TIMEOUT, and back before the others' next call times out
                    try:
                        got = call(torch.tensor([100.0 * step + r])).item()
                        print(kind, step, "OK" if got == 100.0 * step * n + 3 else f"WRONG {got}", flush=True)
                    except hvd.HorovodInternalError as e:
                        print(kind, step, "error:", str(e)[:160], flush=True)
            for epoch in range(2):
                if r == 1 and epoch == 0:
                    time.sleep(7.5)
                try:
                    got = hvd.broadcast_object({"epoch": epoch} if r == 0 else None, root_rank=0)
                    print("object", epoch, "OK" if got == {"epoch": epoch} else f"WRONG {got}", flush=True)
                except hvd.HorovodInternalError as e:
                    print("object", epoch, "error:", str(e)[:160], flush=True)
        """, env={"DDL_TIMEOUT": "5"}, timeout=180)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        by_rank = lines_by_rank(result.stdout)
        for r in range(3):
            lines = by_rank[r]
            self.assertEqual([line for line in lines if "WRONG" in line], [], lines)
            for kind in ("sync", "async"):
                self.assertTrue(next(x for x in lines if x.startswith(f"{kind} 0")).startswith(f"{kind} 0 error:"), lines)
                self.assertIn(f"{kind} 1 OK", lines)
                self.assertIn(f"{kind} 2 OK", lines)
            self.assertTrue(next(x for x in lines if x.startswith("object 0")).startswith("object 0 error:"), lines)
            self.assertIn("object 1 OK", lines)
        late = next(x for x in by_rank[1] if x.startswith("sync 0"))
        self.assertIn("timed out (the timeout of 5 s, DDL_TIMEOUT) before rank 1 submitted it", late)

    def test_a_rank_that_shut_down_early_is_named_in_the_others_error(self):
        # Rank 1 runs out of data and shuts down while rank 0 goes on: rank 0's error said only that
        # talking to the other ranks timed out.
        result = run_python(2, """
            import time, torch, ddl.torch as hvd
            hvd.init()
            if hvd.rank() == 1:
                hvd.shutdown()
                time.sleep(8)
            else:
                time.sleep(1)
                try:
                    hvd.allreduce(torch.ones(2), name="after.shutdown")
                    print("no error")
                except hvd.HorovodInternalError as e:
                    print("HorovodInternalError:", e)
        """, env={"DDL_TIMEOUT": "2"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        error = lines_by_rank(result.stdout)[0][0]
        self.assertIn("timed out talking to the other ranks", error)
        self.assertIn("rank(s) 1 had called ddl_finalize (Python: shutdown()) while this rank still ran ops", error)

    def test_shutdown_waits_for_a_slow_rank_at_most_ddl_timeout_and_warns_without_failing(self):
        # Rank 1 is still at work (a checkpoint) when rank 0 shuts down: rank 0 leaves after
        # DDL_TIMEOUT with a warning and exit code 0, so the launcher does not stop rank 1, whose
        # own shutdown then ends at once.
        result = run_python(2, """
            import time, torch, ddl.torch as hvd
            hvd.init()
            hvd.allreduce(torch.ones(2), name="last.step")
            if hvd.rank() == 1:
                time.sleep(7)
            start = time.monotonic()
            hvd.shutdown()
            print(f"shut down after {time.monotonic() - start:.0f} s")
        """, env={"DDL_TIMEOUT": "2"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertRegex(by_rank[0][0], r"^shut down after [2-5] s$")
        self.assertRegex(by_rank[1][0], r"^shut down after [0-1] s$")
        self.assertIn("ddl: warning: ddl_finalize: rank 0 left without rank(s) 1: they had not finalized within 2 s (DDL_TIMEOUT)",
                      result.stderr)

    def test_a_rank_that_dies_mid_training_fails_the_run_with_its_code(self):
        result = run_python(2, """
            import os, torch, ddl.torch as hvd
            hvd.init()
            for step in range(1000):
                if hvd.rank() == 1 and step == 5:
                    os._exit(17)
                hvd.allreduce(torch.ones(1000), name="grad")
        """, env={"DDL_TIMEOUT": "20"}, timeout=120)
        self.assertEqual(result.returncode, 17, result.stderr)
        self.assertIn("rank 1", result.stderr)


class Join(unittest.TestCase):
    def test_a_join_outlasts_ddl_timeout_while_the_others_train(self):
        # Rank 0 runs out of data at once; rank 1 trains on for 6 s with DDL_TIMEOUT=3 (not 1: on a
        # loaded machine a pause between two of rank 1's steps can outlast a second).
        result = run_python(2, """
            import time, torch, ddl.torch as hvd
            hvd.init()
            if hvd.rank() == 1:
                end, steps = time.monotonic() + 6, 0
                while time.monotonic() < end:
                    total = hvd.allreduce(torch.ones(2), name="grad", op=hvd.Sum)
                    assert total.tolist() == [1.0, 1.0], total  # rank 0 adds zeros
                    steps += 1
                    time.sleep(0.05)
            print("join ->", hvd.join(), flush=True)
        """, env={"DDL_TIMEOUT": "3"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual([lines[-1] for _, lines in sorted(lines_by_rank(result.stdout).items()) if _ is not None],
                         ["join -> 1", "join -> 1"])

    def test_a_join_that_timed_out_stands_in_for_nothing_afterwards(self):
        # Files in ORDER order the ranks, not sleeps: rank 1 submits 'x' only once rank 0's join has
        # failed, and first (a stand-in would complete it with zeros). DDL_TIMEOUT=3, not 1: rank 1's
        # 'x' waits on rank 0 noticing the file, which on a loaded machine can take a while.
        with tempfile.TemporaryDirectory() as order:
            result = run_python(2, """
                import os, time, torch, ddl.torch as hvd
                hvd.init()
                def wait_for(name):
                    deadline = time.monotonic() + 60
                    while not os.path.exists(os.path.join(os.environ["ORDER"], name)):
                        assert time.monotonic() < deadline, "no " + name
                        time.sleep(0.01)
                def say(name):
                    open(os.path.join(os.environ["ORDER"], name), "w").close()
                if hvd.rank() == 0:
                    try:
                        hvd.join()
                    except hvd.HorovodInternalError as e:
                        print("join failed:", e, flush=True)
                    say("join-failed")
                    wait_for("x-sent")
                    time.sleep(0.5)  # not for a pass: lets rank 1's 'x' reach rank 0's engine, where a stand-in would show
                    x = hvd.allreduce(torch.ones(1), name="x", op=hvd.Sum)
                else:
                    wait_for("join-failed")
                    handle = hvd.allreduce_async(torch.ones(1), name="x", op=hvd.Sum)
                    say("x-sent")
                    x = hvd.synchronize(handle)
                print("x =", x.item(), flush=True)
            """, env={"DDL_TIMEOUT": "3", "ORDER": order}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("'ddl.join' timed out: rank(s) 1 never submitted it", by_rank[0][0])
        self.assertEqual([by_rank[0][-1], by_rank[1][-1]], ["x = 2.0", "x = 2.0"])

    def test_unnamed_ops_made_while_another_rank_waited_in_join_do_not_shift_later_ones(self):
        result = run_python(2, """
            import torch, ddl.torch as hvd
            hvd.init()
            if hvd.rank() == 1:
                hvd.barrier()  # completes with rank 0 standing in
                hvd.barrier()
            hvd.join()
            hvd.barrier()
            print("total", hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), flush=True)
        """, env={"DDL_TIMEOUT": "20"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertEqual([by_rank[0][-1], by_rank[1][-1]], ["total 2.0", "total 2.0"])


    def test_an_unnamed_op_is_one_op_whichever_path_each_rank_takes(self):
        # Blocking calls on contiguous host tensors run on the caller's thread and leave an unnamed op
        # to libddl's count; the rest (a tensor that requires grad, a transposed one, the async form)
        # were counted in Python: one op, two names, and both ranks waited until DDL_TIMEOUT.
        code = """
            import torch, ddl.torch as hvd
            hvd.init(); r = hvd.rank()
            loss = (torch.ones(3, requires_grad=True) * 2).sum() if r == 0 else torch.tensor(6.)
            a = hvd.allreduce(loss, op=hvd.Sum).item()
            x = torch.arange(6.).reshape(2, 3)
            b = hvd.allreduce(x.t() if r == 0 else x.t().contiguous(), op=hvd.Sum).sum().item()
            one = torch.ones(2)
            c = (hvd.synchronize(hvd.allreduce_async(one, op=hvd.Sum)) if r == 1 else hvd.allreduce(one, op=hvd.Sum)).sum().item()
            if r == 1:  # async unnamed ops while rank 0 waits in join: counted afresh after it
                hvd.synchronize(hvd.allreduce_async(one, op=hvd.Sum))
                hvd.synchronize(hvd.allreduce_async(one, op=hvd.Sum))
            hvd.join()
            d = (hvd.allreduce(one, op=hvd.Sum) if r == 1 else hvd.synchronize(hvd.allreduce_async(one, op=hvd.Sum))).sum().item()
            print("sums", a, b, c, d, flush=True)
            hvd.shutdown()
        """
        for env in ({}, {"DDL_PYTHON_FASTPATH": "0"}):
            result = run_python(2, code, env={"DDL_TIMEOUT": "20", **env}, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
            by_rank = lines_by_rank(result.stdout)
            self.assertEqual([by_rank[0][-1], by_rank[1][-1]], ["sums 12.0 30.0 4.0 4.0"] * 2, env)


class ProcessSets(unittest.TestCase):
    def test_a_set_one_rank_gets_wrong_fails_on_every_rank_and_later_sets_still_agree(self):
        result = run_python(3, """
            import torch, ddl.torch as hvd
            hvd.init()
            r = hvd.rank()
            try:
                hvd.add_process_set([0, 1] if r == 0 else [0, 7])
            except (ValueError, RuntimeError) as e:
                print("first:", e, flush=True)
            s = hvd.add_process_set([1, 2])
            if r in (1, 2):
                print("second:", hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=s).item(), flush=True)
        """, env={"DDL_TIMEOUT": "20"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("ranks 1,2 asked for an invalid set", by_rank[0][0])
        for r in (1, 2):
            self.assertIn("rank 7 is not a rank of a world of 3", by_rank[r][0])
            self.assertEqual(by_rank[r][1], "second: 2.0")


class Timeline(unittest.TestCase):
    def test_start_timeline_called_by_every_rank_writes_one_valid_file_or_one_per_rank_with_r(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_python(3, f"""
                import torch, ddl.torch as hvd
                hvd.init()
                for path in ("{d}/shared.json", "{d}/rank%r.json"):
                    hvd.start_timeline(path)
                    for step in range(5):
                        hvd.allreduce(torch.ones(100), name="grad")
                    hvd.stop_timeline()
            """, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertEqual(sorted(os.listdir(d)), ["rank0.json", "rank1.json", "rank2.json", "shared.json"])
            for name in os.listdir(d):
                with open(os.path.join(d, name)) as f:
                    events = json.load(f)
                events = events["traceEvents"] if isinstance(events, dict) else events
                self.assertTrue(any("grad" in json.dumps(e) for e in events), name)
                # pid is the rank that wrote the event: shared.json is rank 0's alone
                want = 0 if name == "shared.json" else int(name[len("rank"):-len(".json")])
                self.assertEqual({e["pid"] for e in events if "pid" in e}, {want}, name)


    def test_a_script_that_exits_without_shutdown_leaves_a_valid_timeline(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_python(2, """
                import torch, ddl.torch as hvd
                hvd.init()
                for step in range(20):
                    hvd.allreduce(torch.ones(10), name="grad")
            """, env={"DDL_TIMELINE": f"{d}/t%r.json"}, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            for r in range(2):
                with open(f"{d}/t{r}.json") as f:
                    self.assertGreater(len(json.load(f)["traceEvents"]), 20)


class UnderMpirun(unittest.TestCase):
    def test_process_sets_bootstrap_through_pmix_and_the_run_ends_cleanly(self):
        """Under real OpenMPI mpirun libddl bootstraps through PMIx; process sets rendezvous through it
        without a world-wide fence, and ddl.torch finalizes at exit so mpirun reports success."""
        code = textwrap.dedent("""
            import torch, ddl.torch as hvd
            hvd.init()
            r = hvd.rank()
            a = hvd.add_process_set([0, 2]); b = hvd.add_process_set([1])
            s = a if r in (0, 2) else b
            total = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=s).item()
            gathered = hvd.allgather(torch.tensor([r]), process_set=s).tolist()
            with open(f"{sys.argv[1]}/rank{r}", "w") as out:
                out.write(f"{r} {s.ranks} {total} {gathered}")
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "SLURM_", "PBS_"))}
        env.update(PYTHONPATH=PACKAGE, DDL_TIMEOUT="30")
        # Each rank writes its own file: mpirun forwards ranks' stdout in pieces that may interleave.
        with tempfile.TemporaryDirectory() as results:
            result = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3",
                                     PYTHON, "-c", "import sys\n" + code, results],
                                    env=env, capture_output=True, text=True, timeout=180)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            lines = sorted(open(os.path.join(results, name)).read() for name in os.listdir(results))
        self.assertEqual(lines, ["0 [0, 2] 2.0 [0, 2]", "1 [1] 1.0 [1]", "2 [0, 2] 2.0 [0, 2]"])


class Installed(unittest.TestCase):
    def test_installed_package_imports_and_runs_with_installed_libddl(self):
        with tempfile.TemporaryDirectory() as prefix:
            subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", prefix], check=True, capture_output=True)
            site = os.path.join(prefix, "lib", "python3", "dist-packages")
            self.assertTrue(os.path.isfile(os.path.join(site, "ddl", "torch", "__init__.py")))
            env = {k: v for k, v in os.environ.items() if k not in ("DDL_LIBRARY", "LD_LIBRARY_PATH")}
            env["PYTHONPATH"] = site
            probe = subprocess.run([PYTHON, "-c", "import ddl.torch, ddl._lib as l; print(l.lib._name)"],
                                   env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(probe.returncode, 0, probe.stderr)
            self.assertEqual(os.path.realpath(probe.stdout.strip()), os.path.realpath(os.path.join(prefix, "lib", "libddl.so.0")))
            result = ddl("-np", "2", "--", PYTHON, "-c",
                         "import torch, ddl.torch as hvd; hvd.init(); print(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())",
                         env={"PYTHONPATH": site})
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(lines_by_rank(result.stdout)[0], ["2.0"])


if __name__ == "__main__":
    unittest.main()
