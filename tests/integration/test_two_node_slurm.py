"""ddl against a real two-node Slurm: one slurmd on each host of the test bed (scripts/testbed.sh:
ddlhost1 and ddlhost2, each with its own network, host name, /tmp and /dev/shm), slurmctld and munged
on ddlhost1 (scripts/local_slurm.sh --testbed), each node imitating Perlmutter with 4 fake GPUs of
its own. Every client command (salloc, and sbatch through `ddl submit`) runs inside ddlhost1, so
`ddl run` starts on the allocation's first node and reaches the second through srun. Processes are
looked for on the whole machine (the hosts share its process table), by a marker unique to each test."""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from testbed_hosts import LIGHTNING_PYTHON, LIGHTNING_TRAIN, TESTBED, bed, lightning_reports, workers
from ddl_testing import DDL, PYTHON, SOURCE, comm, kill_leftovers, lines_by_rank, processes_with, read_text, unique_marker, wait_until

DDL = os.path.abspath(DDL)  # commands run on the bed's hosts, in the shared directory
CHECKS = os.path.abspath(os.environ.get("DDL_COLLECTIVE_CHECKS", os.path.join(SOURCE, "build", "tests", "collective_checks")))
LOCAL_SLURM = os.path.join(SOURCE, "scripts", "local_slurm.sh")

# Prints the worker's view as JSON, then (argv[2] == "wait") sleeps until a signal ends it.
WORKER = r"""
import json, os, socket, sys, time
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "DDL_NODE_RANK",
        "DDL_NUM_NODES", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "DDL_STORE_ADDR", "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID"]
info = {k: os.environ.get(k) for k in keys}
info["host"] = socket.gethostname()
print(json.dumps(info), flush=True)
if sys.argv[2] == "wait":
    time.sleep(120)
"""


def local_slurm(*args, timeout=180):
    return subprocess.run(["bash", LOCAL_SLURM, *args, "--testbed"], capture_output=True, text=True, timeout=timeout)


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry)
    except OSError:
        return {}


class TwoNodeSlurm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bed_was_up = bed("status").returncode == 0  # then it is someone else's to stop
        if cls.bed_was_up and bed("exec", "ddlhost1", "test", "-e", DDL).returncode != 0:
            raise RuntimeError(f"the running test bed does not see {DDL} (it was started from another checkout, and keeps its own /tmp): "
                               "stop it with `bash scripts/testbed.sh stop` and run again")
        started = bed("start", "2")
        if started.returncode != 0:
            raise RuntimeError("the test bed did not start:\n" + started.stdout + started.stderr)
        cls.shared = bed("dir").stdout.strip()
        slurm = local_slurm("start")
        if slurm.returncode != 0:
            cls.tearDownClass()
            raise RuntimeError("the two-node Slurm did not start:\n" + slurm.stdout + slurm.stderr)
        cls.conf = local_slurm("env").stdout.strip().split("SLURM_CONF=", 1)[1]

    @classmethod
    def tearDownClass(cls):
        stopped = local_slurm("stop")
        if not cls.bed_was_up:
            bed("stop")
        slurm_dir = os.path.dirname(cls.conf) if hasattr(cls, "conf") else None
        if stopped.returncode != 0 or (slurm_dir and (os.path.exists(slurm_dir) or processes_with(slurm_dir + "/"))):
            raise RuntimeError("local_slurm.sh stop --testbed left something behind:\n" + stopped.stdout + stopped.stderr)

    def setUp(self):
        self.marker = unique_marker()
        self.addCleanup(kill_leftovers, self.marker)

    def env(self):
        """The test's environment without any allocation of its own, pointed at the two-node Slurm."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PBS_", "DDL_")) or k in ("DDL_TESTBED_DIR", "DDL_SLURM_TESTBED_DIR")}
        env["SLURM_CONF"] = self.conf
        return env

    def on_ddlhost1(self, *command, timeout=120, cwd=None):
        """Runs COMMAND inside ddlhost1 to its end."""
        return subprocess.run(["bash", TESTBED, "exec", "ddlhost1", *command], env=self.env(), cwd=cwd or self.shared,
                              capture_output=True, text=True, timeout=timeout)

    def salloc(self, alloc, *ddl_args, timeout=120):
        return self.on_ddlhost1("salloc", "-N", "2", *alloc, DDL, "run", *ddl_args, timeout=timeout)

    def assert_nothing_left(self):
        self.assertTrue(wait_until(lambda: not processes_with(self.marker), 15), f"left running: {processes_with(self.marker)}")

    def test_the_cluster_has_two_perlmutter_like_nodes(self):
        result = self.on_ddlhost1("sinfo", "-h", "-N", "-o", "%N %o %c %z %G %f")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), [f"ddlhost{n} 198.18.0.1{n} 128 1:64:2 gpu:4 gpu" for n in (1, 2)])

    def test_ddl_run_starts_one_worker_per_allocated_gpu_on_each_node(self):
        result = self.salloc(["--gpus-per-node", "4"], "-N", "2", "--gpus-per-node", "4", "--", PYTHON, "-c", WORKER,
                             self.marker, "exit")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual(sorted(found), list(range(8)), result.stdout + result.stderr)
        for rank, w in found.items():
            node, local = divmod(rank, 4)
            self.assertEqual((w["RANK"], w["WORLD_SIZE"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"]),
                             (str(rank), "8", str(local), "4"))
            self.assertEqual((w["GROUP_RANK"], w["GROUP_WORLD_SIZE"], w["DDL_NODE_RANK"], w["DDL_NUM_NODES"]),
                             (str(node), "2", str(node), "2"))
            self.assertEqual(w["host"], f"ddlhost{node + 1}")
            self.assertEqual(w["CUDA_VISIBLE_DEVICES"], str(local))  # the local-rank-th of the 4 GPUs Slurm gave this node
            self.assertEqual(w["MASTER_ADDR"], "ddlhost1")
            self.assertEqual(w["DDL_STORE_ADDR"].split(":")[0], "ddlhost1")
        for key in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
            self.assertEqual(len({w[key] for w in found.values()}), 1, key)

    def test_cpu_workers_without_a_count_follow_the_allocation_s_tasks_per_node(self):
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "--", PYTHON, "-c", WORKER, self.marker, "exit")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual({r: w["host"] for r, w in found.items()}, {0: "ddlhost1", 1: "ddlhost1", 2: "ddlhost2", 3: "ddlhost2"})
        for rank, w in found.items():
            self.assertEqual((w["WORLD_SIZE"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"], w["GROUP_RANK"]),
                             ("4", str(rank % 2), "2", str(rank // 2)))

    def test_libddl_collectives_and_pytorch_ddp_across_the_nodes(self):
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "--", CHECKS, "world", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        for rank in range(4):
            self.assertIn(f"world rank {rank} size 4 local {rank % 2}/2 node {rank // 2}", by_rank.get(rank, []))
            self.assertTrue(any(line.startswith("PASS") for line in by_rank[rank]), by_rank[rank])
        example = os.path.join(SOURCE, "examples", "pytorch_ddp.py")
        result = self.salloc(["--ntasks-per-node", "1"], "--cpu", "--", PYTHON, example, "--epochs", "1", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("world size 2", result.stdout)
        self.assertIn("replicas identical: yes", result.stdout)

    def test_a_lightning_trainer_in_the_allocation_takes_ddl_s_ranks_and_says_nothing_of_srun(self):
        self.assertTrue(os.access(LIGHTNING_PYTHON, os.X_OK), f"{LIGHTNING_PYTHON} is missing: run bash scripts/lightning_venv.sh")
        result = self.salloc(["--ntasks-per-node", "1"], "--cpu", "--", LIGHTNING_PYTHON, LIGHTNING_TRAIN, timeout=480)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        reports = lightning_reports(result.stdout)
        self.assertEqual({r: v[:4] for r, v in reports.items()}, {0: (0, 2, 0, 0), 1: (1, 2, 0, 1)})
        self.assertEqual(len({v[4] for v in reports.values()}), 1, reports)
        # Lightning's complaints about srun's task count (or srun at all) would name it.
        complaints = [line for line in (result.stdout + result.stderr).splitlines()
                      if re.search(r"srun|ntasks", line, re.IGNORECASE) and not line.startswith("salloc:")]
        self.assertEqual(complaints, [])

    def test_exclude_keeps_the_workers_off_a_node_and_the_run_goes_on_the_other(self):
        # The node left out is the first one, where ddl run itself runs and hosts the store: node 0
        # of the run is then ddlhost2, and its workers reach the store back on ddlhost1.
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "--exclude", "ddlhost[1]", "--", PYTHON, "-c", WORKER,
                             self.marker, "exit")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual({r: (w["host"], w["WORLD_SIZE"], w["DDL_NUM_NODES"], w["MASTER_ADDR"]) for r, w in found.items()},
                         {r: ("ddlhost2", "2", "1", "ddlhost2") for r in (0, 1)})
        self.assertRegex(result.stderr, r"ddl: leaving out 1 of Slurm job \d+'s nodes: running on ddlhost2\n")
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "--exclude", "ddlhost1", "--", CHECKS, "world", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        lines = lines_by_rank(result.stdout)
        for rank in (0, 1):
            self.assertIn(f"world rank {rank} size 2 local {rank}/2 node 0", lines.get(rank, []))
            self.assertTrue(any(line.startswith("PASS") for line in lines[rank]), lines[rank])
        result = self.salloc([], "-N", "2", "--cpu", "--exclude", "ddlhost2", "--", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, r"ddl: error: -N 2 but Slurm job \d+ holds 1 node\(s\) besides those --exclude leaves out")

    def test_preflight_exclude_runs_on_the_spare_node_when_the_first_fails_its_probe(self):
        # ddlhost1's libddl made unloadable in its own mount namespace, as a broken node's would be.
        libddl = os.path.realpath(os.path.join(os.path.dirname(DDL), "..", "runtime", "libddl.so.0"))
        broken = bed("exec", "ddlhost1", "mount", "--bind", "/dev/null", libddl)
        self.assertEqual(broken.returncode, 0, broken.stdout + broken.stderr)
        self.addCleanup(bed, "exec", "ddlhost1", "umount", libddl)
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "-N", "1", "--preflight", "exclude", "--", PYTHON, "-c", WORKER,
                             self.marker, "exit", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({r: (w["host"], w["WORLD_SIZE"]) for r, w in workers(result.stdout).items()},
                         {0: ("ddlhost2", "2"), 1: ("ddlhost2", "2")})
        self.assertIn("ddl: preflight: leaving out 1 host(s) that failed: ddlhost1 (libddl does not load", result.stderr)
        self.assertIn("ddl: preflight: 2 rank(s) on 1 host(s) passed\n", result.stderr)
        # Without exclude the run stops before the program, naming the node.
        result = self.salloc(["--ntasks-per-node", "2"], "--cpu", "--preflight", "--", PYTHON, "-c", WORKER, self.marker, "exit",
                             timeout=300)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ddl: error: preflight: 1 host(s) failed, so the program was not started: ddlhost1 (libddl does not load",
                      result.stderr)
        self.assertEqual(workers(result.stdout), {})

    def test_libddl_bootstraps_through_pmix_on_both_nodes_without_ddl_run(self):
        # No ddl run, so no store: the workers find each other through Slurm's PMIx servers alone.
        result = self.on_ddlhost1("salloc", "-N", "2", "--ntasks-per-node", "2", "srun", "--mpi=pmix", CHECKS, "world",
                                  timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        lines = result.stdout.splitlines()
        self.assertEqual(sorted(line for line in lines if line.startswith("world ")),
                         [f"world rank {r} size 4 local {r % 2}/2 node {r // 2}" for r in range(4)])
        self.assertEqual(len([line for line in lines if line.startswith("PASS ")]), 4)

    def test_a_submitted_job_whose_rank_on_the_second_node_fails_returns_its_code(self):
        with tempfile.TemporaryDirectory(dir=self.shared) as tmp:
            # Rank 3's failure kills the step (srun --kill-on-bad-exit), so it fails only once every
            # other rank has said hi (a file in the bed's shared folder, seen on both hosts; bounded
            # at 60 s): on a loaded machine a rank can take longer to start than rank 3 to fail.
            script = (f'echo "hi $RANK on $(hostname)"; touch {tmp}/said.$RANK; '
                      f'if [ "$RANK" = 3 ]; then for r in 0 1 2; do i=0; '
                      f'while [ ! -e {tmp}/said.$r ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; done; '
                      f'echo "rank 3 gives up" >&2; exit 7; fi; exec sleep {self.marker}')
            start = time.monotonic()
            result = self.on_ddlhost1(DDL, "submit", "--site", "slurm", "-N", "2", "--gpus-per-node", "2", "--wait", "--",
                                      "bash", "-c", script, cwd=tmp, timeout=180)
            took = time.monotonic() - start
            self.assertEqual(result.returncode, 7, result.stdout + result.stderr)
            self.assertRegex(result.stdout, r"submitted job \d+ to Slurm \(site slurm\); output: " + re.escape(tmp) + r"/ddl-\d+\.out")
            self.assertRegex(result.stdout, r"job \d+ FAILED on ddlhost\[1-2\].*exit code 7")
            self.assertIn("[3] rank 3 gives up", result.stdout)
            self.assertIn("ddl: error: rank 3 on ddlhost2 exited with code 7", result.stdout)
            with open(result.stdout.split("output: ")[1].split()[0]) as f:
                output = f.read()
            for rank in range(4):
                self.assertIn(f"[{rank}] hi {rank} on ddlhost{rank // 2 + 1}", output)
            self.assertLess(took, 60)
            self.assert_nothing_left()

    def test_a_requeued_job_s_workers_on_both_nodes_save_then_go_on_from_there(self):
        # `ddl run --requeue-signal` as `ddl submit --requeue` writes it; the signal Slurm sends
        # before the time limit (--signal=B:USR1@S) is sent now, to the batch shell alone, and the
        # requeued job's two-minute hold is ended at once (test_requeue.py waits for the real limit).
        worker = os.path.join(SOURCE, "tests", "integration", "requeue_worker.py")
        with tempfile.TemporaryDirectory(dir=self.shared) as tmp:
            output = os.path.join(tmp, "job.out")
            script = f"#!/bin/bash\nexec {DDL} run --cpu --requeue-signal USR1 --max-requeues 1 -- {PYTHON} {worker} {tmp} save 1 {self.marker}\n"
            submitted = subprocess.run(["bash", TESTBED, "exec", "ddlhost1", "sbatch", "-N", "2", "--ntasks-per-node", "1", "--requeue",
                                        "--open-mode=append", "-o", output], input=script, env=self.env(), cwd=tmp, capture_output=True,
                                       text=True, timeout=60)
            self.assertEqual(submitted.returncode, 0, submitted.stderr)
            job = submitted.stdout.split()[-1]

            def job_field(name):
                return re.search(rf"\b{name}=(\S*)", self.on_ddlhost1("scontrol", "show", "job", job).stdout).group(1)

            try:
                self.assertTrue(wait_until(lambda: read_text(output).count("start rank=") == 2, 90), read_text(output))
                self.assertEqual(self.on_ddlhost1("scancel", "--batch", "--signal=USR1", job).returncode, 0)

                held_since = []

                def requeued_and_started_again():
                    # Once the last start has left both nodes (step daemons gone, nodes idle) and 3 s
                    # past: slurmd refuses a new credential within the second it revoked the old one.
                    state = job_field("JobState")
                    held_since[:] = (held_since or [time.monotonic()]) if state == "PENDING" else []
                    nodes = self.on_ddlhost1("sinfo", "-h", "-o", "%T").stdout.split()
                    if (held_since and time.monotonic() - held_since[0] >= 3 and not processes_with(f"slurmstepd: [{job}.")
                            and set(nodes) == {"idle"}):
                        self.on_ddlhost1("scontrol", "update", f"JobId={job}", "StartTime=now")
                    return state in ("COMPLETED", "FAILED")
                self.assertTrue(wait_until(requeued_and_started_again, 120, interval=0.5), read_text(output))
                final = read_text(output)
            finally:
                self.on_ddlhost1("scancel", job)
        self.assertEqual((job_field("JobState"), job_field("ExitCode"), job_field("Restarts")), ("COMPLETED", "0:0", "1"), final)
        for rank in (0, 1):
            host = f"ddlhost{rank + 1}"
            saved = re.search(rf"\[{rank}\] saved rank={rank} step=(\d+)", final)
            self.assertIsNotNone(saved, final)
            self.assertIn(f"[{rank}] start rank={rank} requeues=0 slurm=- step=0 host={host}", final)
            self.assertIn(f"[{rank}] start rank={rank} requeues=1 slurm=1 step={saved.group(1)} host={host}", final)
            self.assertIn(f"[{rank}] done rank={rank} step={int(saved.group(1)) + 10}", final)
        self.assertIn(f"ddl: requeueing job {job} (requeue 1 of 1)", final)
        self.assert_nothing_left()

    def test_a_worker_killed_on_the_second_node_stops_the_whole_job(self):
        launcher = subprocess.Popen(["bash", TESTBED, "exec", "ddlhost1", "salloc", "-N", "2", "--ntasks-per-node", "2", DDL, "run",
                                     "--cpu", "--", PYTHON, "-c", WORKER, self.marker, "wait"],
                                    env=self.env(), cwd=self.shared, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def worker_pids():
                return {(e.get(b"RANK"), e.get(b"SLURMD_NODENAME")): p
                        for p in processes_with(self.marker) if comm(p) == "python3" and b"RANK" in (e := environ(p))}
            self.assertTrue(wait_until(lambda: len(worker_pids()) == 4, 60), f"the workers did not start: {worker_pids()}")
            victim = worker_pids().get((b"3", b"ddlhost2"))
            self.assertIsNotNone(victim, worker_pids())
            time.sleep(1)  # past Python's start-up
            os.kill(victim, signal.SIGKILL)
            start = time.monotonic()
            out, err = launcher.communicate(timeout=60)
            self.assertEqual(launcher.returncode, 128 + signal.SIGKILL, out + err)
            self.assertIn("ddl: error: rank 3 on ddlhost2 was killed by SIGKILL (exit code 137); stopped 3 other worker(s)", err)
            self.assertLess(time.monotonic() - start, 30)
            self.assert_nothing_left()
        finally:
            launcher.kill()
            launcher.communicate()


if __name__ == "__main__":
    unittest.main()
