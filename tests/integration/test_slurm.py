"""ddl against a real Slurm: slurmctld + slurmd + munge on loopback (scripts/local_slurm.sh), one
node imitating Perlmutter (4 fake GPUs, feature gpu). `ddl run` inside salloc goes through srun and
`ddl exec`; `ddl submit` jobs are real sbatch jobs, including the Perlmutter script with real Lmod
modules (tests/fixtures/modulefiles)."""
import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from ddl_testing import (DDL, PYTHON, SOURCE, check_pmix_world, kill_leftovers, lines_by_rank, processes_with, read_text, sleeps_with,
                         slurm_env, start_local_slurm, unique_marker, wait_until)

CHECKS = os.environ.get("DDL_COLLECTIVE_CHECKS", os.path.join(SOURCE, "build", "tests", "collective_checks"))
MODULEFILES = os.path.join(SOURCE, "tests", "fixtures", "modulefiles")
LMOD_INIT = "/usr/share/lmod/lmod/init/bash"
SHOW_WORKER = ("import os, sys, json; print('WORKER ' + json.dumps({k: os.environ.get(k) for k in "
               "['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR', "
               "'MASTER_PORT', 'DDL_STORE_ADDR', 'TORCHELASTIC_RUN_ID', 'OMP_NUM_THREADS', 'DDL_TEST_MODULE_CUDNN', "
               "'DDL_TEST_MODULE_NCCL', 'FI_MR_CACHE_MONITOR', 'SLURM_JOB_ID']} | {'argv': sys.argv[1:]}))")


def run(argv, timeout=120, **kwargs):
    return subprocess.run(argv, env=kwargs.pop("env", slurm_env()), capture_output=True, text=True, timeout=timeout, **kwargs)


# A worker whose rank 1 saves for `seconds` on SIGTERM (ignoring another), and whose rank 0 dies of it.
RANK_1_SAVES_ON_SIGTERM = ("import os, signal, sys, time\n"
                           "def save(sig, frame):\n"
                           "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                           "    time.sleep({seconds})\n"
                           "    print('rank', os.environ['RANK'], 'saved', flush=True)\n"
                           "    sys.exit(0)\n"
                           "if os.environ['RANK'] == '1':\n"
                           "    signal.signal(signal.SIGTERM, save)\n"
                           "print('rank', os.environ['RANK'], 'up', flush=True)\n"
                           "time.sleep(120)\n")


def command_line(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def workers(output):
    """The WORKER json lines of SHOW_WORKER, by rank."""
    found = {}
    for rank, lines in lines_by_rank(output).items():
        for line in lines:
            if line.startswith("WORKER "):
                found[rank] = json.loads(line[len("WORKER "):])
    return found


class Slurm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start_local_slurm()
        cls.node = run(["sinfo", "-h", "-o", "%N"]).stdout.strip()

    def salloc(self, *ddl_args, alloc=("--gpus-per-node=4",), timeout=120):
        return run(["salloc", "-N1", *alloc, DDL, *ddl_args], timeout=timeout)

    def test_ddl_run_inside_salloc_starts_one_worker_per_allocated_gpu(self):
        result = self.salloc("run", "--", PYTHON, "-c", SHOW_WORKER)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual(sorted(found), [0, 1, 2, 3])
        for rank, w in found.items():
            self.assertEqual((w["RANK"], w["WORLD_SIZE"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"], w["GROUP_RANK"]),
                             (str(rank), "4", str(rank), "4", "0"))
            self.assertEqual(w["CUDA_VISIBLE_DEVICES"], str(rank))  # the local-rank-th of the GPUs Slurm gave
            self.assertEqual(w["MASTER_ADDR"], self.node)
            self.assertTrue(w["SLURM_JOB_ID"])
            self.assertEqual(w["OMP_NUM_THREADS"], "32")  # the node's 128 CPUs over 4 workers, via --cpus-per-task
        self.assertEqual(len({w["MASTER_PORT"] for w in found.values()}), 1)
        self.assertEqual(len({w["TORCHELASTIC_RUN_ID"] for w in found.values()}), 1)

    def test_ranks_shows_only_the_chosen_tasks_lines(self):
        result = self.salloc("run", "--ranks", "2", "--", PYTHON, "-c", SHOW_WORKER)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(sorted(workers(result.stdout)), [2])

    def test_prefix_host_labels_each_task_line_with_its_node_and_rank(self):
        result = self.salloc("run", "--prefix", "host", "--", "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2')
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(sorted(result.stdout.splitlines()), [f"[{self.node}:{rank}] out {rank}" for rank in range(4)])
        self.assertEqual(sorted(line for line in result.stderr.splitlines() if line.startswith("[")),
                         [f"[{self.node}:{rank}] err {rank}" for rank in range(4)])

    def test_counts_that_do_not_fit_the_allocation_are_a_clear_error(self):
        result = self.salloc("run", "--gpus-per-node", "4", "--", "true", alloc=("--gpus-per-node=2",))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--gpus-per-node 4 but Slurm job", result.stderr)
        self.assertIn("gives 2 GPU(s) per node", result.stderr)
        result = self.salloc("run", "-N", "2", "--", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("-N 2 but Slurm job", result.stderr)

    def test_exclude_of_the_allocation_s_only_node_is_an_error_and_another_name_is_only_said(self):
        result = self.salloc("run", "--cpu", "--exclude", self.node, "--", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, rf"ddl: error: --exclude {self.node} leaves none of Slurm job \d+'s nodes \({self.node}\)")
        result = self.salloc("run", "--cpu", "-np", "2", "--exclude", "nid[001-002]", "--", "sh", "-c", "echo at $SLURM_NODEID")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr, rf"ddl: --exclude nid001,nid002: not among Slurm job \d+'s nodes \({self.node}\); nothing to "
                                        "leave out for it")
        self.assertEqual(sorted(lines_by_rank(result.stdout).items()), [(0, ["at 0"]), (1, ["at 0"])])
        self.assertNotIn("leaving out", result.stderr)  # nothing was: srun chose the nodes as without --exclude

    def test_a_malformed_node_range_in_exclude_is_an_error_not_a_list_of_none(self):
        # scontrol 22.05 says "Invalid hostlist" and exits with 0, printing no name: that left out
        # nothing, and the run went to the very node named.
        for malformed, why in ((f"{self.node},nid[1-x]", "Invalid hostlist"), ("nid[001-002", "a '[' without its ']'")):
            result = self.salloc("run", "--cpu", "--exclude", malformed, "--", "echo", "ran")
            self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
            self.assertIn(f"ddl: error: --exclude {malformed}: not a Slurm node list", result.stderr)
            self.assertIn(why, result.stderr)
            self.assertNotIn("ran", result.stdout)

    def test_an_array_whose_output_has_no_element_index_is_said_to_share_one_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            shared = self.submit("--site", "slurm", "--array", "0-1", "-o", "sweep.out", "--dry-run", "--", "true", cwd=tmp)
            self.assertEqual(shared.returncode, 0, shared.stderr)
            self.assertIn("ddl: note: --output sweep.out has no %a, so every element of the array writes to that one file", shared.stderr)
            apart = self.submit("--site", "slurm", "--array", "0-1", "-o", "sweep-%A_%a.out", "--dry-run", "--", "true", cwd=tmp)
            self.assertEqual((apart.returncode, apart.stderr), (0, ""))

    def test_submit_exclude_reaches_slurm_which_keeps_the_job_off_the_node(self):
        # The cluster has one node: a job kept off it cannot run, and sbatch says so at once.
        with tempfile.TemporaryDirectory() as tmp:
            result = self.submit("--site", "slurm", "--exclude", self.node, "--", "true", cwd=tmp)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn("Requested node configuration is not available", result.stderr)
            dry = self.submit("--site", "slurm", "--exclude", f"{self.node},nid[001-004]", "--dry-run", "--", "true", cwd=tmp)
            self.assertEqual(dry.returncode, 0, dry.stderr)
            self.assertIn(f"#SBATCH --exclude={self.node},nid[001-004]\n", dry.stdout)

    def test_a_step_srun_cannot_start_is_reported_as_srun_s_failure(self):
        result = self.salloc("run", "--cpus-per-task", "100000", "--", "true")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("srun: error:", result.stderr)
        self.assertRegex(result.stderr, r"ddl: error: srun exited with code \d+ without naming a failed rank")

    def test_libddl_and_pytorch_ddp_run_through_srun(self):
        result = self.salloc("run", "--cpu", "-np", "3", "--", CHECKS, "world", alloc=("-n3",))
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertEqual([by_rank[r][0] for r in range(3)], [f"world rank {r} size 3 local {r}/3 node 0" for r in range(3)])
        example = os.path.join(SOURCE, "examples", "pytorch_ddp.py")
        result = self.salloc("run", "--cpu", "-np", "2", "--", PYTHON, example, "--epochs", "2", alloc=("-n2",), timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("identical", result.stdout)

    def test_cpu_workers_without_a_count_follow_the_allocation_s_tasks_per_node(self):
        # As srun would: salloc --ntasks-per-node 3 means 3 CPU workers, not 1.
        result = self.salloc("run", "--cpu", "--", CHECKS, "world", alloc=("--ntasks-per-node", "3"))
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertEqual([by_rank[r][0] for r in range(3)], [f"world rank {r} size 3 local {r}/3 node 0" for r in range(3)])

    def test_libddl_bootstraps_through_pmix_under_srun_mpi_pmix_without_ddl_run(self):
        # No ddl run, so no store: the workers find each other through Slurm's PMIx server alone.
        env = {k: v for k, v in slurm_env().items() if not k.startswith("DDL_")}
        result = run(["salloc", "-N1", "-n3", "srun", "--mpi=pmix", "-n", "3", CHECKS, "world"], env=env, timeout=300)
        check_pmix_world(self, result, 3)

    def test_unfinished_lines_and_progress_bars_of_tasks_show_while_they_wait(self):
        # srun passes whole lines only: ddl exec --relay sends each task's unfinished line and
        # progress-bar redraw as a line of its own, and ddl run puts the task's line back together.
        script = ("import os, sys, time\n"
                  "from tqdm import tqdm\n"
                  "rank = os.environ['RANK']\n"
                  "sys.stdout.write(f'Loading {rank}...'); sys.stdout.flush()\n"
                  "bar = tqdm(total=4, desc='rank' + rank, mininterval=0, miniters=1, ascii=True, ncols=60)\n"
                  "for _ in range(2):\n"
                  "    time.sleep(0.2); bar.update(1)\n"
                  "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
                  "bar.update(2); bar.close()\n"
                  "print(' done')\n")
        marker = unique_marker()
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            proc = subprocess.Popen(["salloc", "-N1", "-n2", DDL, "run", "--cpu", "--", PYTHON, "-c", script, go, marker],
                                    env=slurm_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = b"", b""
                live = lambda: all(b"[%d] Loading %d..." % (r, r) in out and re.search(rb"\[%d\] rank%d:  50%%" % (r, r), err)
                                   for r in (0, 1))
                deadline = time.monotonic() + 60
                while not live() and time.monotonic() < deadline:
                    for pipe in select.select([proc.stdout, proc.stderr], [], [], 0.5)[0]:
                        data = os.read(pipe.fileno(), 65536)
                        if pipe is proc.stdout:
                            out += data
                        else:
                            err += data
                self.assertTrue(live(), f"each task's unfinished line and 50% should show while it waits: {out!r} {err!r}")
                self.assertIsNone(proc.poll(), "the tasks should still be waiting")
                open(go, "w").close()
                rest_out, rest_err = proc.communicate(timeout=60)
            finally:  # nothing may hold the node for the tests after this one
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                kill_leftovers(marker)
        out, err = (out + rest_out).decode(), (err + rest_err).decode()
        self.assertEqual(proc.returncode, 0, out + err)
        # Another rank's line may come between a line's pieces: it then goes on under its prefix again.
        text = {0: "", 1: ""}
        for line in out.splitlines():
            m = re.match(r"^\[(\d)\] ((?:Loading \1\.\.\.)?(?: done)?)$", line)
            self.assertIsNotNone(m, f"a line with more than one prefix or rank: {line!r} in {out!r}")
            text[int(m[1])] += m[2]
        self.assertEqual(text, {0: "Loading 0... done", 1: "Loading 1... done"})
        for r in (0, 1):
            self.assertRegex(err, r"\[%d\] rank%d: 100%%\|#+\| 4/4 \[[^\r\n]*\n" % (r, r))
        for line in err.splitlines():
            for shown in filter(None, line.split("\r")):  # what each redraw puts on the terminal line
                if not shown.startswith(("salloc: ", "srun: ")):
                    self.assertRegex(shown, r"^\[(\d)\] rank\1: +\d+%\|[#0-9 ]*\| \d/4 \[", err)

    def test_lines_longer_than_srun_s_messages_arrive_whole_and_exact(self):
        # srun --label cuts a task's output into labelled lines of at most 1024 bytes: ddl exec
        # --relay sends a long line in pieces shorter than that, and ddl run joins them again.
        script = ("import sys\n"
                  "sys.stdout.write('a' * 3000 + '\\n' + 'b' * 10 + '\\n' + 'c' * 200000 + '\\n' + '\u00e9' * 2000 + '\\n')\n"
                  "sys.stderr.write('e' * 5000 + '\\n')\n")
        expected_out = "a" * 3000 + "\n" + "b" * 10 + "\n" + "c" * 200000 + "\n" + "\u00e9" * 2000 + "\n"
        with tempfile.TemporaryDirectory() as tmp:
            result = run(["salloc", "-N1", "-n1", DDL, "run", "--cpu", "--output-dir", tmp, "--", PYTHON, "-c", script])
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            with open(os.path.join(tmp, "rank.0.out"), encoding="utf-8") as f:
                self.assertEqual(f.read(), expected_out)
            with open(os.path.join(tmp, "rank.0.err"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "e" * 5000 + "\n")
        # One task: nothing comes between a line's pieces, so ddl's own output shows each line whole.
        self.assertEqual(result.stdout, "".join("[0] " + line + "\n" for line in expected_out.splitlines()))
        self.assertIn("[0] " + "e" * 5000 + "\n", result.stderr)

    def test_a_signal_slurm_sends_reaches_each_worker_once(self):
        # slurmstepd signals every process of the step, the worker too: ddl exec, between srun and
        # the worker, must not pass it on again (a checkpoint handler would run twice).
        script = ("import os, signal, sys, time\n"
                  "got = []\n"
                  "signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n"
                  "print('ready', flush=True)\n"
                  "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
                  "time.sleep(0.5)\n"
                  "print('usr1', len(got), flush=True)\n")
        marker = unique_marker()
        name = f"sig{marker}"
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            proc = subprocess.Popen(["salloc", "-N1", "-n2", "-J", name, DDL, "run", "--cpu", "--", PYTHON, "-c", script, go, marker],
                                    env=slurm_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                out = ""
                deadline = time.monotonic() + 60
                while out.count("ready") < 2 and time.monotonic() < deadline:
                    if select.select([proc.stdout], [], [], 0.5)[0]:
                        out += os.read(proc.stdout.fileno(), 65536).decode()
                self.assertEqual(out.count("ready"), 2, out)
                signalled = run(["scancel", "--signal=USR1", "--name", name])
                self.assertEqual(signalled.returncode, 0, signalled.stderr)
                time.sleep(1)
                open(go, "w").close()
                rest, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                kill_leftovers(marker)
        self.assertEqual(proc.returncode, 0, out + rest + err)
        self.assertEqual(sorted(line for line in (out + rest).splitlines() if "usr1" in line), ["[0] usr1 1", "[1] usr1 1"])

    def test_a_step_srun_could_not_launch_fails_the_run_though_srun_exits_with_0(self):
        # slurmstepd cannot make the step's PMIx socket (a file of that name is in the way), and
        # srun 22.05 then says "task 0 launch failed" and exits with 0: before, so did ddl run,
        # with no worker ever run.
        with tempfile.TemporaryDirectory() as tmp:
            output = os.path.join(tmp, "job.out")
            script = f"#!/bin/bash\n{DDL} run --cpu -- {PYTHON} -c 'print(1)'\necho ddl exited with $?\n"
            held = run(["sbatch", "--hold", "-N1", "-n2", "-o", output], input=script, cwd=tmp)
            self.assertEqual(held.returncode, 0, held.stderr)
            job = held.stdout.split()[-1]
            spool = os.path.join(os.environ.get("DDL_SLURM_DIR", "/tmp/ddl-slurm"), "slurmd")
            in_the_way = os.path.join(spool, f"stepd.slurm.pmix.{job}.0")
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(in_the_way)
                try:
                    self.assertEqual(run(["scontrol", "release", job]).returncode, 0)
                    self.assertTrue(wait_until(lambda: "ddl exited" in read_text(output), 60), read_text(output))
                finally:
                    os.unlink(in_the_way)
            text = read_text(output)
        self.assertIn("task 0 launch failed", text)  # srun's word, as the cause
        self.assertIn("ddl: error: srun exited with 0, but rank(s) 0-1 never started (its messages above may say why)", text)
        self.assertIn("ddl exited with 1", text)

    def test_a_failing_worker_ends_the_whole_step_with_its_code(self):
        marker = unique_marker()
        script = f'if [ "$RANK" = 2 ]; then echo "rank 2 gives up" >&2; exit 7; fi; exec sleep {marker}'
        try:
            start = time.monotonic()
            result = self.salloc("run", "--", "bash", "-c", script)
            took = time.monotonic() - start
            self.assertEqual(result.returncode, 7, result.stderr)
            self.assertIn(f"ddl: error: rank 2 on {self.node} exited with code 7", result.stderr)
            self.assertIn("| rank 2 gives up", result.stderr)
            self.assertLess(took, 30)
            self.assertTrue(wait_until(lambda: not processes_with(marker), 10), "sleepers outlived the failed step")
        finally:
            kill_leftovers(marker)

    def test_a_hang_under_srun_shows_every_task_s_stacks_grouped_and_ends_the_step(self):
        # Each task's ddl exec relays its worker's stacks after the quiet; ddl run groups and stops.
        env = slurm_env()
        env.update(PYTHONPATH=os.path.join(SOURCE, "build", "python"), DDL_TIMEOUT="600")
        hang_worker = os.path.join(SOURCE, "tests", "integration", "hang_worker.py")
        result = run(["salloc", "-N1", "--gpus-per-node=4", DDL, "run", "--cpu", "-np", "4", "--hang-timeout", "12", "--", PYTHON, hang_worker,
                      "barrier_skipped"], env=env, timeout=180)
        self.assertEqual(result.returncode, 124, result.stdout + result.stderr)
        self.assertRegex(result.stderr, r"\nddl: ranks 0-2: in barrier \(host_ops.py:\d+\)\n")
        self.assertRegex(result.stderr, r"\nddl: rank 3: in load_batch \(hang_worker.py:\d+\)\n")
        self.assertIn("ddl: error: the run hung: nothing moved for 12 s (--hang-timeout; the stacks are above); stopped 4 worker(s)",
                      result.stderr)
        self.assertTrue(wait_until(lambda: not [p for p in processes_with("hang_worker.py")], 20), "tasks outlived the hung step")

    def signal_ddl_run_in_salloc(self, sig, alloc, workers, *ddl_args):
        """`salloc ALLOC ddl run DDL_ARGS -- sleep MARKER`, `sig` to ddl run once the `workers` sleeps run:
        (salloc's exit code, stderr); nothing of the run may be left."""
        marker = unique_marker()
        proc = subprocess.Popen(["salloc", "-N1", *alloc, DDL, "run", *ddl_args, "--", "sleep", marker], env=slurm_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The workers' sleeps: salloc, srun and ddl carry the marker too, so a count of all of
            # them can be reached while some task has not started yet.
            self.assertTrue(wait_until(lambda: len(sleeps_with(marker)) >= workers, 30), "the workers did not start")
            ddl_pids = [p for p in processes_with(marker) if command_line(p)[1:2] == [b"run"]]
            self.assertEqual(len(ddl_pids), 1)
            os.kill(ddl_pids[0], sig)
            _, err = proc.communicate(timeout=60)
            self.assertTrue(wait_until(lambda: not processes_with(marker), 15), "tasks outlived ddl run")
            return proc.returncode, err
        finally:
            proc.kill()
            kill_leftovers(marker)

    def test_sigterm_to_ddl_run_inside_salloc_stops_every_task(self):
        _, err = self.signal_ddl_run_in_salloc(signal.SIGTERM, ["--gpus-per-node=4"], 4)
        self.assertIn("ddl: interrupted by SIGTERM; stopped 4 worker(s)", err)  # srun's tasks, not srun

    def test_ctrl_c_to_ddl_run_directly_under_salloc_exits_130_not_salloc_s_0(self):
        # salloc reports a child killed by a signal as exit 0: ddl run, which elsewhere dies of the
        # SIGINT (so that a shell loop stops), exits 130 under it.
        code, err = self.signal_ddl_run_in_salloc(signal.SIGINT, ["-n2"], 2, "--cpu", "-np", "2")
        self.assertEqual(code, 130, err)
        self.assertIn("ddl: interrupted by SIGINT; stopped 2 worker(s)", err)

    def signal_under_srun(self, worker, whom, sig=signal.SIGTERM, *ddl_args):
        """Starts `ddl run --cpu -np 2 ... -- PYTHON -c worker` in salloc and, once both workers said
        'up', sends `sig` to `whom(marker)` (a pid): returns (exit code, stdout, stderr, seconds to the end)."""
        marker = unique_marker()
        proc = subprocess.Popen(["salloc", "-N1", "-n2", DDL, "run", "--cpu", "-np", "2", *ddl_args, "--", PYTHON, "-c", worker, marker],
                                env=slurm_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out = ""
            deadline = time.monotonic() + 60
            while out.count(" up") < 2 and time.monotonic() < deadline:
                if select.select([proc.stdout], [], [], 0.5)[0]:
                    out += os.read(proc.stdout.fileno(), 65536).decode()
            self.assertEqual(out.count(" up"), 2, out)
            stopped_at = time.monotonic()
            os.kill(whom(marker), sig)
            rest, err = proc.communicate(timeout=60)
            took = time.monotonic() - stopped_at
            self.assertTrue(wait_until(lambda: not processes_with(marker), 15), "tasks outlived ddl run")
            return proc.returncode, out + rest, err, took
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            kill_leftovers(marker)

    @staticmethod
    def ddl_run_of(marker):
        pids = [p for p in processes_with(marker) if command_line(p)[1:2] == [b"run"]]
        assert len(pids) == 1, pids
        return pids[0]

    def test_sigterm_to_ddl_run_under_srun_gives_each_task_its_handler_and_grace(self):
        # srun itself answers SIGTERM by killing its tasks at once: ddl run signals them through Slurm.
        saver = ("import os, signal, sys, time\n"
                 "def save(sig, frame):\n"
                 "    print('rank', os.environ['RANK'], 'got', signal.Signals(sig).name, flush=True)\n"
                 "    time.sleep(1)\n"
                 "    print('rank', os.environ['RANK'], 'saved', flush=True)\n"
                 "    sys.exit(0)\n"
                 "signal.signal(signal.SIGTERM, save)\n"
                 "print('rank', os.environ['RANK'], 'up', flush=True)\n"
                 "time.sleep(120)\n")
        code, out, err, _ = self.signal_under_srun(saver, self.ddl_run_of)
        self.assertEqual(code, 143, out + err)
        for rank in (0, 1):
            self.assertIn(f"[{rank}] rank {rank} got SIGTERM\n", out, err)
            self.assertIn(f"[{rank}] rank {rank} saved\n", out, err)
        self.assertIn("ddl: interrupted by SIGTERM; stopped 2 worker(s)", err)
        self.assertNotIn("got SIGCONT", err)  # srun's word for a SIGCONT sent to it: none is

    def test_tasks_ignoring_sigterm_under_srun_are_killed_after_the_grace_period(self):
        stubborn = ("import os, signal, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "print('rank', os.environ['RANK'], 'up', flush=True)\n"
                    "time.sleep(120)\n")
        code, out, err, took = self.signal_under_srun(stubborn, self.ddl_run_of, signal.SIGTERM, "--grace-period", "2")
        self.assertEqual(code, 143, out + err)
        self.assertIn("ddl: interrupted by SIGTERM; stopped 2 worker(s)", err)
        self.assertGreater(took, 1.5, err)  # the grace, then SIGKILL through Slurm
        self.assertLess(took, 30, err)

    def test_under_srun_a_rank_that_dies_of_the_stop_signal_leaves_the_others_their_grace(self):
        # Rank 0 has no handler and dies of SIGTERM at once; rank 1 saves for 4 s. srun
        # (--kill-on-bad-exit, ddl's fail-fast) ended the step: rank 1 was killed mid-save after
        # Slurm's KillWait (2 s here).
        saver = RANK_1_SAVES_ON_SIGTERM.format(seconds=4)
        code, out, err, _ = self.signal_under_srun(saver, self.ddl_run_of, signal.SIGTERM, "--grace-period", "20")
        self.assertEqual(code, 143, out + err)
        self.assertIn("[1] rank 1 saved\n", out, err)
        self.assertIn("ddl: interrupted by SIGTERM; stopped 2 worker(s)", err)

    def test_a_stop_that_reaches_a_task_a_moment_before_ddl_run_interrupts_the_run_and_keeps_the_grace(self):
        # scancel of the job, or its time limit, signals the tasks and ddl run about together. Rank 0
        # dies of it first and its relay says so; ddl run's own SIGTERM came next and was taken for
        # a second one: SIGKILL to every task, rank 1's save lost.
        saver = RANK_1_SAVES_ON_SIGTERM.format(seconds=3)

        def rank_0_task_then_ddl_run(marker):
            os.kill(self.task_of_rank(marker, 0), signal.SIGTERM)
            time.sleep(1)
            return self.ddl_run_of(marker)

        code, out, err, _ = self.signal_under_srun(saver, rank_0_task_then_ddl_run, signal.SIGTERM, "--grace-period", "20")
        self.assertIn("[1] rank 1 saved\n", out, err)
        self.assertEqual(code, 143, out + err)
        self.assertIn("ddl: interrupted by SIGTERM", err)

    @staticmethod
    def task_of_rank(marker, rank):
        tasks = [p for p in processes_with(marker) if command_line(p)[1:2] == [b"exec"]]
        for pid in tasks:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"SLURM_PROCID={rank}\0".encode() in f.read():
                    return pid
        raise AssertionError(f"no task of rank {rank} among {tasks}")

    def test_a_signal_that_reaches_one_task_alone_fails_the_run_as_that_rank_s_end(self):
        # ddl exec ends with 0 after a stop signal (so that srun leaves the others saving) and relays
        # how its program ended: the signal did not come from ddl run, so that rank failed.
        sleeper = ("import os, time\n"
                   "print('rank', os.environ['RANK'], 'up', flush=True)\n"
                   "time.sleep(120)\n")

        code, out, err, took = self.signal_under_srun(sleeper, lambda marker: self.task_of_rank(marker, 1))
        self.assertEqual(code, 143, out + err)
        self.assertRegex(err, r"rank 1 .*SIGTERM", err)
        self.assertNotIn("interrupted", err)
        self.assertNotIn("srun: error:", err)  # every task ended with 0: ddl run had it from the relay
        self.assertLess(took, 30, err)

    def submit(self, *args, cwd, timeout=180):
        return run([DDL, "submit", *args], cwd=cwd, timeout=timeout)

    def test_the_perlmutter_script_runs_here_with_its_modules_and_reversed_gpus(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = slurm_env()
            env["MODULEPATH"] = MODULEFILES
            # Real Lmod: `module` is a shell function; sbatch carries it (exported) into the job.
            command = (f"source {LMOD_INIT} && export MODULEPATH={MODULEFILES} && "
                       f"exec {DDL} submit --site perlmutter -A m1234_g -t 00:05:00 -J 'pm test' --wait -- {PYTHON} -c \"$SHOW\"")
            env["SHOW"] = SHOW_WORKER
            result = subprocess.run(["bash", "-c", command], env=env, cwd=tmp, capture_output=True, text=True, timeout=180)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertRegex(result.stdout, r"submitted job \d+ to Slurm \(site perlmutter\); output: .*/ddl-\d+\.out")
            self.assertRegex(result.stdout, r"job \d+ COMPLETED on " + self.node + r", exit code 0")
            output_file = result.stdout.split("output: ")[1].split()[0]
            with open(output_file) as f:
                found = workers(f.read())
            self.assertEqual(sorted(found), [0, 1, 2, 3])
            for rank, w in found.items():
                self.assertEqual(w["WORLD_SIZE"], "4")
                self.assertEqual(w["CUDA_VISIBLE_DEVICES"], str(3 - rank))  # Perlmutter's reversed GPU order
                self.assertEqual(w["DDL_TEST_MODULE_CUDNN"], "8.7.0")      # module load ran in the job
                self.assertEqual(w["DDL_TEST_MODULE_NCCL"], "2.15.5-ofi")
                self.assertEqual(w["FI_MR_CACHE_MONITOR"], "userfaultfd")  # the profile's environment

    def test_a_job_array_runs_each_element_with_its_index_and_wait_reports_every_end(self):
        element = ("import os, sys; print('element', os.environ['DDL_ARRAY_INDEX'], os.environ['SLURM_ARRAY_TASK_ID'], os.environ['RANK'], "
                   "flush=True); sys.exit(3 if os.environ['DDL_ARRAY_INDEX'] == '2' else 0)")
        with tempfile.TemporaryDirectory() as tmp:
            dry = self.submit("--site", "slurm", "--gpus-per-node", "0", "--array", "0-2%2", "--dry-run", "--", PYTHON, "-c", element, cwd=tmp)
            self.assertEqual(dry.returncode, 0, dry.stderr)
            self.assertIn("#SBATCH --array=0-2%2\n", dry.stdout)
            self.assertIn("#SBATCH --output=ddl-%A_%a.out\n", dry.stdout)  # one file per element
            result = self.submit("--site", "slurm", "--gpus-per-node", "0", "--array", "0-2%2", "--wait", "--", PYTHON, "-c", element,
                                 cwd=tmp, timeout=300)
            self.assertEqual(result.returncode, 3, result.stdout + result.stderr)  # the first element that failed
            array = re.search(r"submitted job array (\d+) to Slurm \(site slurm\); output: ddl-%A_%a.out", result.stdout).group(1)
            for i in range(3):
                self.assertRegex(result.stdout, rf"element {array}_{i}: \w+, exit {3 if i == 2 else 0}\n")
                with open(os.path.join(tmp, f"ddl-{array}_{i}.out")) as f:
                    self.assertIn(f"element {i} {i} 0", f.read())
            # ddl status lists a held array's elements one by one (squeue alone shows them as one line).
            held = self.submit("--site", "slurm", "--gpus-per-node", "0", "--array", "0-1", "--directive=--hold", "--", "true", cwd=tmp)
            self.assertEqual(held.returncode, 0, held.stdout + held.stderr)
            held_id = re.search(r"submitted job array (\d+)", held.stdout).group(1)
            try:
                listed = run([DDL, "status"])
                self.assertEqual(listed.returncode, 0, listed.stderr)
                for i in range(2):
                    self.assertRegex(listed.stdout, rf"job {held_id}_{i} PENDING")
            finally:
                run(["scancel", held_id])
        bad = self.submit("--site", "slurm", "--array", "1-x", "--dry-run", "--", "true", cwd="/")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--array '1-x' is not a Slurm array", bad.stderr)

    def test_user_values_with_shell_syntax_stay_inert_text(self):
        with tempfile.TemporaryDirectory() as tmp:
            pwned = os.path.join(tmp, "pwned")
            # A lone ":" would end srun's program and start another (MPMD) if it reached srun as it is.
            nasty = [f"$(touch {pwned}1)", f"`touch {pwned}2`", "it's \"quoted\"", "two\nlines", "; touch " + pwned + "3",
                     ":", "-N1", "/usr/bin/touch", pwned + "4", "\\:", ":", "carriage\r\nreturn\r"]
            result = self.submit("--site", "slurm", "--gpus-per-node", "1", "-J", f"x $(touch {pwned}0) `id`", "--wait",
                                 "--", PYTHON, "-c", SHOW_WORKER, *nasty, cwd=tmp)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            output_file = result.stdout.split("output: ")[1].split()[0]
            with open(output_file) as f:
                found = workers(f.read())
            self.assertEqual(found[0]["argv"], nasty)
            self.assertEqual([n for n in os.listdir(tmp) if n.startswith("pwned")], [])
            newline_name = self.submit("--site", "slurm", "-J", "a\nb", "--dry-run", "--", "true", cwd=tmp)
            self.assertEqual(newline_name.returncode, 2)
            self.assertIn("-J/--job-name contains a newline", newline_name.stderr)

    def job_field(self, job, field):
        """One field of a job exactly as Slurm holds it: squeue prints a lone field whole (':0'), newlines
        and all, so nothing in the value can be mistaken for another field."""
        result = run(["squeue", "-h", "-t", "all", "-j", job, "-O", field + ":0"])
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout[:-1] if result.stdout.endswith("\n") else result.stdout

    def test_backslashes_and_quotes_in_directive_values_reach_slurm_unchanged(self):
        # sbatch reads a backslash in an #SBATCH line as an escape, inside quotes too.
        with tempfile.TemporaryDirectory() as tmp:
            for value in ["a\\b", "ends in \\", "say \"hi\" it's", "\\\\two", "a#b"]:
                with self.subTest(value=value):
                    output = os.path.join(tmp, f"dir-{value}.out")
                    result = self.submit("--site", "slurm", "--gpus-per-node", "0", "-J", value, "--comment", value, "-o", output,
                                         "--directive=--hold", "--", "true", cwd=tmp)
                    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                    job = result.stdout.split("submitted job ")[1].split()[0]
                    try:
                        self.assertEqual(self.job_field(job, "Name"), value)
                        self.assertEqual(self.job_field(job, "Comment"), value)
                        self.assertEqual(self.job_field(job, "STDOUT"), output)
                    finally:
                        run(["scancel", job])

    def test_wait_reads_state_exit_code_and_output_file_whatever_the_name_and_path_hold(self):
        # scontrol's one-line output cannot be split safely: a name may hold blanks and Key= text.
        hostile = "x JobState=COMPLETED ExitCode=7:0 StdOut=/etc/hostname Reason=None"
        with tempfile.TemporaryDirectory() as tmp:
            result = self.submit("--site", "slurm", "--gpus-per-node", "0", "-J", hostile, "-o", os.path.join(tmp, "my out %j.txt"),
                                 "--wait", "--", "bash", "-c", "echo marker; exit 3", cwd=tmp)
            self.assertEqual(result.returncode, 3, result.stdout + result.stderr)
            job = result.stdout.split("submitted job ")[1].split()[0]
            output = os.path.join(tmp, f"my out {job}.txt")
            self.assertIn(f"output: {output}\n", result.stdout)
            self.assertRegex(result.stdout, rf"job {job} FAILED on {self.node} \(NonZeroExitCode\), exit code 3")
            # srun's own line about the failed task may come before the task's last output, or after.
            tail = result.stdout.split(f" lines of {output} ---\n", 1)[1].splitlines()
            self.assertIn("[0] marker", tail, result.stdout)
            # Slurm's own file name rules: a backslash turns %j off and is dropped.
            result = self.submit("--site", "slurm", "--gpus-per-node", "0", "-o", os.path.join(tmp, "a\\b-%j.out"), "--wait", "--", "true",
                                 cwd=tmp)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn(f"output: {tmp}/ab-%j.out\n", result.stdout)
            self.assertTrue(os.path.exists(os.path.join(tmp, "ab-%j.out")))
            # Still pending, whatever its name says: --wait gives up at its timeout, ddl status agrees.
            result = self.submit("--site", "slurm", "--gpus-per-node", "0", "-J", hostile, "--directive=--hold", "--wait",
                                 "--wait-timeout", "2", "--", "true", cwd=tmp)
            job = result.stdout.split("submitted job ")[1].split()[0]
            try:
                self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
                self.assertIn(f"job {job} PENDING (JobHeldUser)", result.stdout)
                self.assertNotIn("COMPLETED", result.stdout)
                self.assertIn(f"stopped following job {job} before it ended", result.stderr)
            finally:
                run(["scancel", job])
            # A name ddl would refuse, from sbatch itself: '|' and a newline cannot shift the fields either.
            job = run(["sbatch", "--parsable", "--hold", "-J", f"a|b\n{job}|COMPLETED|None|vm|1792|", "-o", "/dev/null", "--wrap", "true"],
                      cwd=tmp).stdout.strip()
            try:
                status = run([DDL, "status", job])
                self.assertEqual(status.returncode, 0, status.stderr)
                self.assertEqual(status.stdout, f"job {job} PENDING (JobHeldUser)\noutput: /dev/null\n")
                self.assertIn(f"job {job} PENDING (JobHeldUser)\n", run([DDL, "status"]).stdout)
            finally:
                run(["scancel", job])

    def test_a_submit_that_reaches_no_controller_says_so_and_that_nothing_was_submitted(self):
        # A real sbatch with a slurm.conf whose controller port has no slurmctld behind it.
        with tempfile.TemporaryDirectory() as tmp:
            conf = os.path.join(tmp, "slurm.conf")
            with open(conf, "w") as f:
                f.write("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=2\n"
                        "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n")
            env = dict(slurm_env(), SLURM_CONF=conf)
            result = run([DDL, "submit", "--site", "slurm", "--", "true"], cwd=tmp, env=env, timeout=120)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn("sbatch could not reach the scheduler, so nothing was submitted: "
                          "sbatch: error: Batch job submission failed: Unable to contact slurm controller", result.stderr)
            self.assertIn("check that Slurm answers here (sinfo)", result.stderr)
            self.assertNotIn("refused", result.stderr)
            self.assertEqual(os.listdir(tmp), ["slurm.conf"], "a failed submit leaves no file behind")
            # No slurm.conf at all (and no DNS record for a controller): no scheduler to ask, not a refusal.
            env = {k: v for k, v in slurm_env().items() if k != "SLURM_CONF"}
            if not os.path.exists("/etc/slurm/slurm.conf"):
                result = run([DDL, "submit", "--site", "slurm", "--", "true"], cwd=tmp, env=env, timeout=120)
                self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
                self.assertIn("sbatch could not reach the scheduler, so nothing was submitted: sbatch: fatal: Could not establish a "
                              "configuration source", result.stderr)
            # No qsub on PATH for a PBS site.
            env["PATH"] = "/nonexistent"
            result = run([DDL, "submit", "--site", "pbs", "-c", "1", "--", "true"], cwd=tmp, env=env, timeout=120)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn("ddl: error: qsub: not found on PATH, so nothing was submitted", result.stderr)
            self.assertIn("hint: submit from a login node of the PBS cluster", result.stderr)

    def test_a_failing_job_reports_its_exit_code_and_output_tail(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = self.submit("--site", "slurm", "--gpus-per-node", "2", "--wait", "--", "bash", "-c",
                                 'echo "last words of $RANK"; [ "$RANK" = 1 ] && exit 3; sleep 30', cwd=tmp)
            self.assertEqual(result.returncode, 3, result.stdout + result.stderr)
            self.assertRegex(result.stdout, r"job \d+ FAILED on .*exit code 3")
            self.assertIn("[1] last words of 1", result.stdout)
            self.assertIn("ddl: error: rank 1 on", result.stdout)

    def test_cancel_ends_a_running_job_and_leaves_nothing_behind(self):
        marker = unique_marker()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = self.submit("--site", "slurm", "--gpus-per-node", "1", "--", "sleep", marker, cwd=tmp)
                self.assertEqual(result.returncode, 0, result.stderr)
                job = result.stdout.split("submitted job ")[1].split()[0]
                self.assertTrue(wait_until(lambda: processes_with(marker), 30), "the job did not start")
                listed = run([DDL, "status"])
                self.assertIn(f"job {job} RUNNING on {self.node}", listed.stdout)
                cancelled = run([DDL, "cancel", job])
                self.assertEqual(cancelled.returncode, 0, cancelled.stderr)
                self.assertTrue(wait_until(lambda: "CANCELLED" in run([DDL, "status", job]).stdout, 30))
                self.assertTrue(wait_until(lambda: not processes_with(marker), 30), "the job's worker outlived scancel")
                # scancel exits with 0 for an ended or unknown job: ddl says it cancelled nothing.
                again = run([DDL, "cancel", job])
                self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
                self.assertEqual(again.stdout, f"job {job} had already ended or is ending: nothing to cancel\n")
                unknown = run([DDL, "cancel", "987654"])
                self.assertEqual(unknown.returncode, 1, unknown.stdout + unknown.stderr)
                self.assertIn("Invalid job id specified", unknown.stderr)
                bad = run([DDL, "cancel", "12; rm -rf /"])
                self.assertEqual(bad.returncode, 2)
                self.assertIn("is not a job id", bad.stderr)
            finally:
                kill_leftovers(marker)


if __name__ == "__main__":
    unittest.main()
