"""libddl across real processes started by `ddl run`: every op, dtype and size checked against values
the worker computes itself (tests/integration/collective_checks.cpp), mismatches, a killed rank,
the timeline, and the single-process world."""
import json
import os
import re
import subprocess
import tempfile
import time
import unittest

from ddl_testing import check_pmix_world, ddl, lines_by_rank

GPU_CHECKS = os.environ.get("DDL_GPU_CHECKS", "")
CHECKS = os.environ.get("DDL_COLLECTIVE_CHECKS",
                        os.path.join(os.path.dirname(__file__), "..", "..", "build", "tests", "collective_checks"))


class Collectives(unittest.TestCase):
    def run_checks(self, workers, *args, env=None, timeout=300):
        result = ddl("-np", str(workers), "--", CHECKS, *args, env=env, timeout=timeout)
        return result, lines_by_rank(result.stdout)

    def test_every_op_dtype_and_size_on_1_2_3_4_and_8_ranks(self):
        # One node: shared memory by default; DDL_SHM=0 takes the Gloo (TCP) path multi-node runs use.
        for workers, shm in ((1, "1"), (2, "1"), (3, "1"), (4, "1"), (8, "1"), (2, "0"), (3, "0"), (4, "0")):
            with self.subTest(workers=workers, shm=shm):
                result, by_rank = self.run_checks(workers, env={"DDL_SHM": shm})
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
                for rank in range(workers):
                    self.assertRegex(by_rank[rank][-1], rf"^PASS \d+ checks on rank {rank} of {workers}$")

    def test_a_rank_with_its_own_fusion_threshold_follows_rank_0(self):
        # Which ops fuse decides which collectives run: were rank 1 to fuse nothing while its peers
        # fuse, the transports would get out of step. Every rank uses rank 0's threshold.
        per_rank = 'if [ "$RANK" = 1 ]; then export DDL_FUSION_THRESHOLD=0; fi; exec "$0" all'
        for shm in ("1", "0"):
            with self.subTest(shm=shm):
                result = ddl("-np", "3", "--", "sh", "-c", per_rank, CHECKS, env={"DDL_SHM": shm, "DDL_TIMEOUT": "60"}, timeout=300)
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
                by_rank = lines_by_rank(result.stdout)
                for rank in range(3):
                    self.assertRegex(by_rank[rank][-1], rf"^PASS \d+ checks on rank {rank} of 3$")

    def test_bootstrap_through_pmix_under_real_mpirun(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "SLURM_", "PBS_"))}
        result = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", CHECKS, "world"], env=env,
                                capture_output=True, text=True, timeout=300)
        check_pmix_world(self, result, 3)

    def test_a_second_ddl_init_in_one_process_starts_a_fresh_world_under_ddl_run(self):
        result, by_rank = self.run_checks(3, "reinit")
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        for rank in range(3):
            self.assertRegex(by_rank[rank][-1], rf"^PASS \d+ checks on rank {rank} of 3$")
        # Not under mpirun: a second PMIx_Init/PMIx_Finalize in one process hung now and then in
        # libpmix 4.2.2 under load (docs/libddl.md).

    def test_bootstrap_through_the_ddl_run_store_reports_the_contract_world(self):
        result, by_rank = self.run_checks(2, "world")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([by_rank[r][0] for r in range(2)], [f"world rank {r} size 2 local {r}/2 node 0" for r in range(2)])

    @unittest.skipUnless(os.path.exists(GPU_CHECKS), "libddl was built without NCCL: no CUDA path to test")
    def test_cuda_ops_without_a_gpu_fail_clearly_and_host_ops_still_work(self):
        if subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
            self.skipTest("a GPU is visible: the gpu-labelled test covers the CUDA path here")
        result = ddl("-np", "2", "--", GPU_CHECKS, "no-gpu")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        for lines in lines_by_rank(result.stdout).values():
            self.assertTrue(lines[0].startswith("cuda op without a GPU: unsupported: op 'gpu.sum': "), lines[0])
            self.assertIn("no GPU is visible", lines[0])

    def test_without_a_launcher_the_world_is_one_process(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDL_")}
        result = subprocess.run([CHECKS], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"PASS \d+ checks on rank 0 of 1")

    def test_a_shape_mismatch_fails_on_every_rank_naming_the_op_and_ranks(self):
        result, by_rank = self.run_checks(3, "mismatch")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        expected = ("mismatch status mismatch between ranks: op 'grad/w1' differs between ranks: "
                    "rank 0-1: allreduce float32[4] sum; rank 2: allreduce float32[5] sum")
        for rank in range(3):
            self.assertEqual(by_rank[rank][0], expected)

    def test_a_set_whose_members_never_meet_is_an_error_within_its_own_timeout(self):
        for shm in ("1", "0"):
            with self.subTest(shm=shm):
                result, by_rank = self.run_checks(2, "lonely_set", env={"DDL_SHM": shm, "DDL_TIMEOUT": "600"}, timeout=120)
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
                for rank in range(2):
                    said = [line for line in by_rank[rank] if line.startswith("lonely set status")]
                    self.assertEqual(len(said), 1, by_rank[rank])
                    self.assertRegex(said[0], rf"^lonely set status bootstrap failed after [2-9] s: ddl_process_set_create_among: "
                                              rf"connecting ranks 0,1 \(key lonely\.{rank}\) failed")

    def test_process_sets_made_wrong_on_some_ranks_fail_on_every_rank_without_a_crash(self):
        # A NULL output on one rank, a timeout under a millisecond, members that disagree on the list
        # (over shared memory: a segment made for 2 ranks mapped as one for 3 was a SIGBUS).
        for shm in ("1", "0"):
            with self.subTest(shm=shm):
                result, by_rank = self.run_checks(3, "set_edges", env={"DDL_SHM": shm, "DDL_TIMEOUT": "60"}, timeout=120)
                self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
                for rank in range(3):
                    self.assertTrue(by_rank[rank][-1].startswith("PASS"), by_rank[rank])

    def test_finalize_waits_for_a_rank_that_never_finalizes_at_most_ddl_timeout(self):
        result, by_rank = self.run_checks(3, "late_finalize", "8", env={"DDL_TIMEOUT": "3"}, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
        self.assertRegex(by_rank[0][-1], r"^finalize status timed out after [3-6] s: ddl_finalize: rank 0 left without rank\(s\) 1,2: "
                                         r"they had not finalized within 3 s \(DDL_TIMEOUT\)$")
        for rank in (1, 2):  # left behind: their own finalize ends at once
            self.assertRegex(by_rank[rank][-1], r"^finalize status \w[\w ]* after [0-5] s")

    def test_a_rank_killed_mid_allreduce_becomes_an_error_on_every_survivor(self):
        for shm in ("1", "0"):
            with self.subTest(shm=shm):
                self.check_killed_rank(shm)

    def check_killed_rank(self, shm):
        start = time.monotonic()
        # Survivors ignore ddl run's SIGTERM, so the error they print is the runtime's own.
        result, by_rank = self.run_checks(3, "die", "1", env={"DDL_TIMEOUT": "5", "DDL_SHM": shm}, timeout=120)
        took = time.monotonic() - start
        self.assertEqual(result.returncode, 137)  # ddl run reports the root cause: rank 1's SIGKILL
        self.assertIn("rank 1 on ", result.stderr)
        # Every survivor reports the runtime's error (none dies of SIGPIPE on the dead peer's socket).
        for rank in (0, 2):
            lines = by_rank.get(rank, [])
            self.assertTrue(lines, f"rank {rank} printed nothing:\n{result.stdout}\n{result.stderr}")
            for line in lines:
                self.assertTrue(line.startswith(f"survivor rank {rank}: peer failed: "), line)
        self.assertLess(took, 5 + 10)

    def test_a_rank_that_stops_answering_is_a_timeout_on_every_survivor(self):
        # Frozen (SIGSTOP), not dead: its sockets and shared memory stay, only DDL_TIMEOUT ends the wait.
        for shm in ("1", "0"):
            with self.subTest(shm=shm):
                result, by_rank = self.run_checks(3, "freeze", "1", env={"DDL_TIMEOUT": "3", "DDL_SHM": shm}, timeout=120)
                self.assertEqual(result.returncode, 3, result.stdout[-2000:] + result.stderr[-2000:])
                for rank in (0, 2):
                    lines = by_rank.get(rank, [])
                    self.assertTrue(lines, f"rank {rank} printed nothing:\n{result.stdout}\n{result.stderr}")
                    for line in lines:
                        self.assertTrue(line.startswith(f"survivor rank {rank}: timed out: "), line)

    def test_edges_of_the_c_api_that_broke_the_world_hung_or_wrapped_around(self):
        with tempfile.TemporaryDirectory() as tmp:
            first, second = os.path.join(tmp, "first.%r.json"), os.path.join(tmp, "second.json")
            # DDL_TIMEOUT with room: each rank waits for a fork()ed child to exit, which under the
            # sanitizers runs a leak check of the whole process first, while the other ranks wait.
            # With the straggler report on: rank 0's fork()ed child leaves it to its parent at exit.
            env = {"DDL_TIMELINE": first, "DDL_TIMEOUT": "90", "DDL_REPORT_STRAGGLERS": "1"}
            result, by_rank = self.run_checks(3, "edges", second, env=env, timeout=240)
            self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-2000:])
            reports = [line for line in result.stderr.splitlines() if "ddl: stragglers over" in line]
            self.assertEqual(len(reports), 1, result.stderr[-3000:])
            for rank in range(3):
                self.assertTrue(by_rank[rank][-1].startswith("PASS"), by_rank[rank])
                with open(first.replace("%r", str(rank))) as f:  # whole, though a child exited, and ended by the restart
                    ops = {e["args"]["op"] for e in json.load(f)["traceEvents"] if e["ph"] == "X"}
                self.assertIn("grad/\ufffd\ufffd", ops)
                self.assertNotIn("edges.last", ops)
            with open(second) as f:
                self.assertIn("edges.last", {e["args"]["op"] for e in json.load(f)["traceEvents"] if e["ph"] == "X"})

    def test_the_timeline_is_chrome_trace_json_with_every_phase(self):
        # A fused allreduce over Gloo is copied into a fusion buffer and out again; shared memory
        # reduces it straight from the ops' buffers (one ALLREDUCE phase), but for fp16-compressed
        # ops, which it packs as float16 like Gloo.
        for shm in ("0", "1"):
            with self.subTest(shm=shm), tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "timeline.%r.json")
                result, _ = self.run_checks(2, env={"DDL_TIMELINE": path, "DDL_SHM": shm})
                self.assertEqual(result.returncode, 0, result.stderr)
                for rank in (0, 1):
                    with open(path.replace("%r", str(rank))) as f:
                        trace = json.load(f)
                    self.check_timeline(trace["traceEvents"], rank, packs_every_fused_op=shm == "0")

    def test_a_timeline_path_that_cannot_be_written_is_said_and_the_run_goes_on(self):
        with tempfile.TemporaryDirectory() as tmp:
            missing = os.path.join(tmp, "no-such-dir", "t.%r.json")
            result, _ = self.run_checks(2, env={"DDL_TIMELINE": missing})
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            for rank in (0, 1):  # it was silent
                self.assertIn(f"ddl: rank {rank}: DDL_TIMELINE: cannot write {missing.replace('%r', str(rank))} "
                              "(No such file or directory); no timeline is written", result.stderr)
            # Every %r is the rank (the second was left as it was).
            twice = os.path.join(tmp, "t.%r.%r.json")
            result, _ = self.run_checks(2, env={"DDL_TIMELINE": twice})
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            self.assertEqual(sorted(os.listdir(tmp)), ["t.0.0.json", "t.1.1.json"])

    def check_timeline(self, events, rank, packs_every_fused_op):
        phases = {e["name"] for e in events if e["ph"] == "X"}
        self.assertTrue({"NEGOTIATE", "WAIT", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER",
                         "broadcast", "allgather", "allgatherv", "alltoall", "barrier"} <= phases, phases)
        # A fused run of an allreduce: its phases follow one another, in this order, on its row
        # (the same name may also have run alone in another step, with phases of its own).
        by_op = {}
        for e in events:
            if e["ph"] == "X":
                by_op.setdefault(e["args"]["op"], []).append(e)
        packed_runs, unpacked_runs = [], []
        for op, evs in by_op.items():
            evs.sort(key=lambda e: e["ts"])
            names = [e["name"] for e in evs]
            for i, name in enumerate(names):
                if name == "MEMCPY_IN_FUSION_BUFFER":
                    packed_runs.append(evs[i - 2:i + 3])
                elif name == "ALLREDUCE" and names[i - 1] == "WAIT":
                    unpacked_runs.append((op, evs[i - 2:i + 1]))
        self.assertTrue(packed_runs, "no op was packed into a fusion buffer")
        for run in packed_runs:
            self.assertEqual([e["name"] for e in run], ["NEGOTIATE", "WAIT", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"])
        if packs_every_fused_op:
            self.assertEqual(unpacked_runs, [])
        else:
            self.assertTrue(any(not op.startswith("fp16.") for op, _ in unpacked_runs), "no fused op was reduced in place")
            for op, run in unpacked_runs:
                self.assertFalse(op.startswith("fp16."), op)
                self.assertEqual([e["name"] for e in run], ["NEGOTIATE", "WAIT", "ALLREDUCE"])
        for run in packed_runs + [run for _, run in unpacked_runs]:
            for before, after in zip(run, run[1:]):
                self.assertLessEqual(before["ts"] + before["dur"], after["ts"] + 1)  # 1 µs of rounding
        rows = {e["args"]["name"] for e in events if e["ph"] == "M"}
        self.assertIn("allreduce.f32.sum.7", rows)
        # A process set's ops are in the world's timeline, on rows named after the set, on its
        # members only (check_gather_and_alltoall_on_a_set: every rank but 0).
        set_rows = {row for row in rows if re.fullmatch(r"set\d+/set\.(allgather|alltoall)", row)}
        self.assertEqual(len(set_rows), 0 if rank == 0 else 2, sorted(rows))
        set_phases = {e["name"] for e in events if e["ph"] == "X" and e["args"]["op"] in set_rows}
        self.assertEqual(set_phases, set() if rank == 0 else {"NEGOTIATE", "WAIT", "allgather", "alltoall"})
        self.assertTrue(all(e["pid"] == rank for e in events))
        self.assertTrue(all(e["dur"] >= 0 for e in events if e["ph"] == "X"))

if __name__ == "__main__":
    unittest.main()
