"""torch.distributed's "ddl" backend (python/ddl/distributed.py) under `ddl run`: every collective
against gloo's result, DDP and Lightning training with backend "ddl", subgroups, and failures that
reach the other ranks within torch's timeout. Debian's torch 1.13 on the CPU; the torch 2.x / CUDA
path needs the GPU machine (not here)."""
import json
import os
import re
import shutil
import tempfile
import textwrap
import time
import unittest

from ddl_testing import PYTHON, SOURCE, ddl, lines_by_rank

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.environ.get("DDL_BUILD_DIR", os.path.join(HERE, "..", "..", "build")), "python")
CHECKS = os.path.join(HERE, "torch_backend_checks.py")
LIGHTNING_PYTHON = os.environ.get("DDL_LIGHTNING_PYTHON") or "/var/cache/ddl/lightning-venv/bin/python"


def run_python(np, code_or_file, *args, python=PYTHON, env=None, timeout=300):
    """Runs a Python worker under `ddl run -np NP` with the build tree's ddl package."""
    program = [code_or_file] if os.path.exists(code_or_file) else ["-c", textwrap.dedent(code_or_file)]
    return ddl("-np", str(np), "--", python, *program, *args, env={"PYTHONPATH": PACKAGE, **(env or {})},
               timeout=timeout, cwd=HERE)


class EveryCollectiveAgainstGloo(unittest.TestCase):
    def check_on(self, np):
        result = run_python(np, CHECKS)
        output = result.stdout[-4000:] + result.stderr[-3000:]
        self.assertEqual(result.returncode, 0, output)
        by_rank = lines_by_rank(result.stdout)
        for rank in range(np):
            self.assertEqual([line for line in by_rank[rank] if line.startswith("FAIL")], [], output)
            count = int(by_rank[rank][-1].removeprefix("checks passed: "))
            # Every rank runs the same checks but the one-rank subgroup's (the last rank only).
            self.assertGreaterEqual(count, 43, by_rank[rank])

    def test_on_2_ranks(self):
        self.check_on(2)

    def test_on_3_ranks(self):
        self.check_on(3)


class Training(unittest.TestCase):
    def test_the_ddp_example_with_backend_ddl_ends_with_identical_replicas_on_4_ranks(self):
        result = run_python(4, os.path.join(SOURCE, "examples", "pytorch_ddp.py"), "--backend", "ddl", "--epochs", "3")
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("backend ddl", by_rank[0][0])
        for rank in range(4):
            self.assertIn(f"allreduce check: rank {rank} world 4 got [10, 100] expected [10, 100] ok", by_rank[rank])
        self.assertTrue(any(line.startswith("replicas identical: yes") for line in by_rank[0]), by_rank[0])

    def test_ddl_timeline_shows_the_ddp_groups_allreduces_on_every_rank(self):
        # The torch group is a libddl process set with an engine of its own; its ops go into the
        # world's timeline, on rows named after the group's set ("torch.<group>.<nonce>/allreduce.N").
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "timeline.%r.json")
            result = run_python(2, os.path.join(SOURCE, "examples", "pytorch_ddp.py"), "--backend", "ddl", "--epochs", "1",
                                env={"DDL_TIMELINE": path})
            self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
            for rank in range(2):
                with open(path.replace("%r", str(rank))) as f:
                    events = json.load(f)["traceEvents"]
                group_ops = [e for e in events if e["ph"] == "X" and re.fullmatch(r"torch\.[^/]+/allreduce\.\d+", e["args"]["op"])]
                self.assertGreater(len({e["args"]["op"] for e in group_ops}), 10, f"rank {rank}: {len(events)} events")
                self.assertLessEqual({"NEGOTIATE", "WAIT"}, {e["name"] for e in group_ops})
                self.assertTrue(all(e["pid"] == rank for e in events))

    def test_lightning_ddp_strategy_with_process_group_backend_ddl(self):
        self.assertTrue(os.access(LIGHTNING_PYTHON, os.X_OK), f"{LIGHTNING_PYTHON} is missing: run bash scripts/lightning_venv.sh")
        result = run_python(2, os.path.join(HERE, "lightning_train.py"), "--backend", "ddl", python=LIGHTNING_PYTHON,
                            timeout=480)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        hashes = set()
        for rank in range(2):
            self.assertIn("lightning backend ddl", by_rank[rank])
            reports = [line for line in by_rank[rank] if line.startswith(f"lightning rank {rank} of 2 ")]
            self.assertEqual(len(reports), 1, by_rank[rank])
            hashes.add(reports[0].split()[-1])
        self.assertEqual(len(hashes), 1, f"the ranks' weights differ: {hashes}")


class Groups(unittest.TestCase):
    def test_a_subgroup_after_the_world_is_made_again_forms_on_its_members(self):
        # torch's group ids start again after destroy_process_group(), and a non-member never sees
        # a group: rank 0 made no group "1" the first time, ranks 1 and 2 did.
        with tempfile.TemporaryDirectory() as tmp:
            result = run_python(3, f"""
                import datetime, torch, torch.distributed as dist, ddl.distributed
                timeout = datetime.timedelta(seconds=20)
                dist.init_process_group("ddl", timeout=timeout)
                rank = dist.get_rank()
                dist.new_group([1, 2])
                dist.barrier()
                dist.destroy_process_group()
                dist.init_process_group("ddl", init_method="file://{tmp}/store", rank=rank, world_size=3, timeout=timeout)
                group = dist.new_group([0, 1], timeout=timeout)
                t = torch.full((2,), float(rank + 1))
                if rank < 2:
                    dist.all_reduce(t, group=group)
                print(t.tolist(), flush=True)
                dist.destroy_process_group()
            """, env={"DDL_TIMEOUT": "60"}, timeout=180)
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-3000:])
        self.assertEqual([lines_by_rank(result.stdout)[r] for r in range(3)], [["[3.0, 3.0]"], ["[3.0, 3.0]"], ["[3.0, 3.0]"]])


class TorchBackendFlag(unittest.TestCase):
    """`ddl run --torch-backend ddl`: scripts that name gloo (or nothing) run on the ddl backend unchanged."""

    def test_the_unmodified_gloo_ddp_example_runs_on_ddl_with_no_pythonpath(self):
        # No PYTHONPATH: the hook makes the ddl package beside this ddl importable itself.
        result = ddl("-np", "2", "--torch-backend", "ddl", "--", PYTHON, os.path.join(SOURCE, "examples", "pytorch_ddp.py"),
                     "--epochs", "1", env={"PYTHONPATH": None}, timeout=300, cwd="/")
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("backend ddl", by_rank[0][0])
        self.assertTrue(any(line.startswith("replicas identical: yes") for line in by_rank[0]), by_rank[0])
        self.assertIn("init_process_group('gloo') runs on backend 'ddl' (ddl run --torch-backend ddl)", result.stderr)

    def test_an_unmodified_lightning_script_runs_on_ddl(self):
        self.assertTrue(os.access(LIGHTNING_PYTHON, os.X_OK), f"{LIGHTNING_PYTHON} is missing: run bash scripts/lightning_venv.sh")
        result = ddl("-np", "2", "--torch-backend", "ddl", "--", LIGHTNING_PYTHON, os.path.join(HERE, "lightning_train.py"),
                     env={"PYTHONPATH": None}, timeout=480, cwd=HERE)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        for rank in range(2):
            self.assertIn("lightning backend ddl", by_rank[rank])

    def one_worker_with_a_site_customization(self, site_code, program):
        """Rank 0's lines of `python -c program` under --torch-backend ddl, with a sitecustomize of
        `site_code` on PYTHONPATH for the hook to shadow."""
        site = tempfile.mkdtemp(prefix="ddl-site-")
        self.addCleanup(shutil.rmtree, site, ignore_errors=True)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(site_code)
        result = ddl("-np", "1", "--torch-backend", "ddl", "--", PYTHON, "-c", program, env={"PYTHONPATH": site},
                     timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return lines_by_rank(result.stdout)[0]

    def test_a_script_that_makes_no_group_is_untouched_and_a_sitecustomize_it_shadows_still_runs(self):
        said = self.one_worker_with_a_site_customization(
            "import builtins\nbuiltins.SITE_WAS_HERE = True\n",
            "import builtins, sys; print(getattr(builtins, 'SITE_WAS_HERE', False), 'torch' in sys.modules)")
        self.assertEqual(said, ["True False"])

    def test_a_failing_shadowed_sitecustomize_still_leaves_the_hook_installed(self):
        said = self.one_worker_with_a_site_customization(
            "raise RuntimeError('a broken site customization')\n",
            "import sys; print([type(f).__name__ for f in sys.meta_path if 'TorchDistributed' in type(f).__name__])")
        self.assertEqual(said, ["['_PatchTorchDistributedOnImport']"])

    def test_a_python_that_would_not_run_the_hook_is_refused_naming_its_flag(self):
        # python -I (or -E, -S) ignores PYTHONPATH or sitecustomize: the script's gloo ran, without a word.
        for flag in ("-I", "-E", "-S"):
            result = ddl("-np", "1", "--torch-backend", "ddl", "--", PYTHON, flag, "-c", "print('ran')", timeout=60)
            self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
            self.assertNotIn("ran", result.stdout)
            self.assertIn(f"ddl: error: --torch-backend ddl: '{PYTHON} {flag}' keeps ddl's start-up hook from running", result.stderr)

    def test_a_group_that_names_its_own_backend_keeps_it(self):
        # Scripts make gloo groups for what ddl does not do (send/recv): those stay gloo.
        code = ("import torch.distributed as dist; dist.init_process_group('gloo'); g = dist.new_group(backend='gloo'); "
                "h = dist.new_group(); print(dist.get_backend(), dist.get_backend(g), dist.get_backend(h)); "
                "dist.destroy_process_group()")
        result = ddl("-np", "2", "--torch-backend", "ddl", "--", PYTHON, "-c", code, env={"PYTHONPATH": None}, timeout=180,
                     cwd="/")
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
        self.assertEqual(lines_by_rank(result.stdout)[0], ["ddl gloo ddl"])

    def under_plain_ddl_run(self, code):
        """The lines of each of 2 ranks of `python -c code` under `ddl run`, with no flag and no PYTHONPATH."""
        result = ddl("-np", "2", "--", PYTHON, "-c", code, env={"PYTHONPATH": None}, timeout=180, cwd="/")
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
        return lines_by_rank(result.stdout)

    def test_init_process_group_ddl_needs_no_import_of_ddl_under_plain_ddl_run(self):
        # No flag, no PYTHONPATH, no `import ddl.distributed`: the hook registers the backend when a
        # group asks for it (torch 2's "cpu:ddl,cuda:ddl" spelling too; Debian's torch 1.13 has no such).
        by_rank = self.under_plain_ddl_run(
            "import torch, torch.distributed as dist; dist.init_process_group(backend='ddl'); "
            "t = torch.ones(3) * (dist.get_rank() + 1); dist.all_reduce(t); print(dist.get_backend(), t.tolist())")
        self.assertEqual([by_rank[0], by_rank[1]], [["ddl [3.0, 3.0, 3.0]"]] * 2)

    def test_under_plain_ddl_run_a_gloo_script_imports_nothing_of_ddl(self):
        by_rank = self.under_plain_ddl_run(
            "import sys, torch, torch.distributed as dist; dist.init_process_group('gloo'); g = dist.new_group(); "
            "print(dist.get_backend(), dist.get_backend(g), sorted(m for m in sys.modules if m.split('.')[0] == 'ddl'))")
        self.assertEqual(by_rank[0], ["gloo gloo []"])

    def test_a_subgroup_on_ddl_under_a_gloo_world_needs_no_import_either(self):
        by_rank = self.under_plain_ddl_run(
            "import torch, torch.distributed as dist; dist.init_process_group('gloo'); g = dist.new_group(backend='ddl'); "
            "t = torch.ones(2); dist.all_reduce(t, group=g); print(dist.get_backend(g), t.tolist())")
        self.assertEqual(by_rank[1], ["ddl [2.0, 2.0]"])

    def test_a_first_ddl_subgroup_of_some_ranks_under_a_gloo_world_is_an_error_not_a_hang(self):
        # libddl joins the whole world when it starts; rank 0, outside the group, never would.
        result = ddl("-np", "2", "--", PYTHON, "-c",
                     "import torch.distributed as dist; dist.init_process_group('gloo'); dist.new_group([1], backend='ddl')",
                     env={"PYTHONPATH": None}, timeout=120, cwd="/")
        self.assertEqual(result.returncode, 1, result.stdout[-2000:] + result.stderr[-2000:])
        self.assertIn("the first 'ddl' group must hold every rank: this one holds 1 of 2", result.stderr)

    def test_another_backend_is_one_clear_error(self):
        result = ddl("-np", "1", "--torch-backend", "nccl", "--", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--torch-backend nccl: the only backend ddl can put under a script is ddl", result.stderr)


class OutOfStep(unittest.TestCase):
    """A group's ops pair up by their place in its sequence. A call only rank 0 makes, whose tensor
    equals the next call's, paired with the others' next call: a wrong sum, silently (as gloo). With
    DDL_CHECK_CALL_SITES=1 the two places differ and the op fails on every rank naming both; the
    group's sequence is then broken, so the later calls fail at once instead of pairing wrongly or
    waiting for the timeout. Without it, the partner-less last call times out and breaks it."""

    SKIP = """
        import datetime, torch, torch.distributed as dist, ddl.distributed
        dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=5))  # a group's ops wait this long
        r, n = dist.get_rank(), dist.get_world_size()
        def attempt(what, f):
            try:
                print(what, "->", f(), flush=True)
            except Exception as e:
                print(what, "raised", "differs between ranks" in str(e), "out of step" in str(e),
                      "skip_check.py:" in str(e), "timed out" in str(e), flush=True)
        # The call sites are the lines that call dist.all_reduce (the innermost frame of the program).
        if r == 0:
            attempt("lone", lambda: (dist.all_reduce(t := torch.ones(1)), t.tolist())[1])
        attempt("both", lambda: (dist.all_reduce(t := torch.ones(1) * (r + 1)), t.tolist())[1])
        attempt("later", lambda: (dist.all_reduce(t := torch.ones(1) * (r + 1)), t.tolist())[1])
        # A new group starts its own sequence: in step again. Its members meet in the world's store,
        # whose waits last the 5 s of the world's timeout: rank 0 comes only after its own "later"
        # timed out, so the store gets longer.
        dist.distributed_c10d._get_default_store().set_timeout(datetime.timedelta(seconds=60))
        g = dist.new_group(list(range(n)))
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        print("new group", t.tolist(), flush=True)
    """

    def run_skip(self, np, env):
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        script = os.path.join(folder, "skip_check.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(self.SKIP))
        result = run_python(np, script, env={"DDL_TIMEOUT": "5", **env}, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        return lines_by_rank(result.stdout)

    def test_with_call_sites_a_skipped_call_fails_on_every_rank_naming_both_places(self):
        for np in (2, 3):
            with self.subTest(ranks=np):
                by_rank = self.run_skip(np, {"DDL_CHECK_CALL_SITES": "1"})
                # "out of step" errors quote the first failure, the mismatch naming both places.
                self.assertEqual(by_rank[0], ["lone raised True False True False", "both raised True True True False",
                                              "later raised True True True False", f"new group [{float(np)}]"])
                for r in range(1, np):
                    self.assertEqual(by_rank[r], ["both raised True False True False", "later raised True True True False",
                                                  f"new group [{float(np)}]"])

    def test_without_call_sites_the_partner_less_call_times_out_and_the_sequence_breaks(self):
        # What gloo does too: rank 0's lone call pairs with rank 1's "both" (3.0 where rank 0 alone
        # meant 1 + 2), its "both" with rank 1's "later"; its own "later" has no partner and times out.
        by_rank = self.run_skip(2, {})
        self.assertEqual(by_rank[0], ["lone -> [3.0]", "both -> [3.0]", "later raised False False False True", "new group [2.0]"])
        self.assertEqual(by_rank[1], ["both -> [3.0]", "later -> [3.0]", "new group [2.0]"])


class Failures(unittest.TestCase):
    def test_a_rank_that_dies_mid_step_fails_the_run_with_its_code(self):
        started = time.monotonic()
        result = run_python(2, """
            import os, torch, torch.distributed as dist, ddl.distributed
            dist.init_process_group("ddl")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 100))
            for step in range(1000):
                if dist.get_rank() == 1 and step == 5:
                    os._exit(17)
                model(torch.ones(8, 100)).sum().backward()
        """, timeout=120)
        self.assertEqual(result.returncode, 17, result.stderr[-3000:])
        self.assertIn("rank 1", result.stderr)
        self.assertLess(time.monotonic() - started, 100)

    def test_an_op_a_member_never_submits_fails_on_the_others_within_torchs_timeout(self):
        # Rank 1 stays alive (so ddl run stops nothing) but submits no op; torch was given 3 s.
        result = run_python(2, """
            import datetime, time, torch, torch.distributed as dist, ddl.distributed
            dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=3))
            if dist.get_rank() == 1:
                time.sleep(12)
            else:
                started = time.monotonic()
                try:
                    dist.all_reduce(torch.ones(4))
                    print("no error", flush=True)
                except RuntimeError as error:
                    print(f"error after {time.monotonic() - started:.0f} s:", str(error).splitlines()[0], flush=True)
        """, env={"DDL_TIMEOUT": "600"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        line = lines_by_rank(result.stdout)[0][0]
        self.assertRegex(line, r"^error after [2-9] s:", line)
        self.assertIn("allreduce", line)


    def test_ddp_s_gradient_allreduce_that_fails_raises_in_backward(self):
        # Rank 1 skips a backward: rank 0's bucket allreduce times out. torch's reducer reads the
        # op's future in C++; a failure stored as a Python exception crashed it (SIGSEGV).
        result = run_python(2, """
            import datetime, time, torch, torch.distributed as dist, ddl.distributed
            dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=3))
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10))
            model(torch.ones(2, 10)).sum().backward()
            if dist.get_rank() == 1:
                time.sleep(8)
            else:
                try:
                    model(torch.ones(2, 10)).sum().backward()
                    print("no error", flush=True)
                except RuntimeError as error:
                    print("raised:", " ".join(str(error).split())[:300], flush=True)
        """, env={"DDL_TIMEOUT": "600"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        line = lines_by_rank(result.stdout)[0][0]
        self.assertRegex(line, r"^raised: .*timed out", line)

    def test_destroy_process_group_waits_for_the_group_s_ops_in_flight_as_gloo_s_does(self):
        result = run_python(2, """
            import time, torch, torch.distributed as dist, ddl.distributed
            dist.init_process_group("ddl")
            t = torch.full((4,), float(dist.get_rank() + 1))
            if dist.get_rank() == 1:
                time.sleep(1)  # rank 0's op is still in flight when it destroys the group
            work = dist.all_reduce(t, async_op=True)
            dist.destroy_process_group()
            print("after destroy:", t.tolist(), flush=True)
            work.wait()
        """, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr[-3000:])
        for rank in (0, 1):
            self.assertEqual(lines_by_rank(result.stdout)[rank], ["after destroy: [3.0, 3.0, 3.0, 3.0]"])


if __name__ == "__main__":
    unittest.main()
