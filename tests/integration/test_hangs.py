"""ddl run's hang watchdog (--hang-timeout, --hang-action) and Ctrl-\\ (SIGQUIT): every rank's stacks,
grouped by identical stack, on this machine. test_hosts.py and test_slurm.py run it across hosts and
under srun."""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, PYTHON, SOURCE, ddl, write_executable

HANG_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_worker.py")
# ddl's package; libddl's own timeout must not end the barrier before the watchdog does.
WORKER_ENV = {"PYTHONPATH": os.path.join(SOURCE, "build", "python"), "DDL_TIMEOUT": "600"}


def groups(stderr):
    """{"ranks 0-1": "in f (x.py:3)", ...} from the report's group lines."""
    return dict(re.findall(r"^ddl: (ranks? [\d, -]+): (.*)$", stderr, re.M))


class Hangs(unittest.TestCase):
    def test_a_rank_stuck_in_a_loop_while_the_others_wait_in_a_barrier_is_shown_and_the_run_stops(self):
        with tempfile.TemporaryDirectory() as out_dir:
            start = time.monotonic()
            result = ddl("-np", "3", "--hang-timeout", "8", "--output-dir", out_dir, "--", PYTHON, HANG_WORKER, "barrier_skipped",
                         env=WORKER_ENV, timeout=120)
            took = time.monotonic() - start
            self.assertEqual(result.returncode, 124, result.stderr)
            self.assertIn("ddl: no worker has written output or completed a libddl op for 8 s (--hang-timeout)", result.stderr)
            found = groups(result.stderr)
            self.assertIn("ranks 0-1", found, result.stderr)
            self.assertRegex(found["rank 2"], r"^in load_batch \(hang_worker.py:\d+\)$")
            self.assertRegex(result.stderr, r'File ".*hang_worker.py", line \d+ in wait_at_barrier')
            self.assertNotRegex(result.stderr, r"0x[0-9a-f]{6,}")  # thread ids left out
            self.assertIn("ddl: error: the run hung: nothing moved for 8 s (--hang-timeout; the stacks are above); stopped 3 worker(s)",
                          result.stderr)
            self.assertLess(took, 60)  # not libddl's DDL_TIMEOUT
            with open(os.path.join(out_dir, "stacks.txt")) as f:
                saved = f.read()
            self.assertRegex(saved, r"ddl: rank 2: in load_batch \(hang_worker.py:\d+\)")
            self.assertRegex(saved, r"^# \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n")

    def test_a_hang_is_restarted_under_max_restarts_as_a_failure_is(self):
        worker = ("import os, sys, time\n"
                  "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                  "    time.sleep(300)\n"
                  "print('finished', os.environ['RANK'], flush=True)\n")
        result = ddl("-np", "2", "--hang-timeout", "3", "--max-restarts", "1", "--", PYTHON, "-c", worker, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ddl: no worker has written output or completed a libddl op for 3 s (--hang-timeout)", result.stderr)
        self.assertIn("ddl: the run hung: nothing moved for 3 s (--hang-timeout); restarting all workers (1 of 1 restarts)",
                      result.stderr)
        self.assertEqual(sorted(result.stdout.splitlines()), ["[0] finished 0", "[1] finished 1"])

    def test_libddl_ops_without_output_are_not_a_hang(self):
        # Twice the timeout and more, silent but for the ops: each completed op is a sign of life.
        result = ddl("-np", "2", "--hang-timeout", "8", "--", PYTHON, HANG_WORKER, "quiet_allreduces", "18", env=WORKER_ENV, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("stacks", result.stderr)
        self.assertEqual(result.stdout.count("done"), 2)

    def test_a_tmpdir_that_does_not_exist_does_not_make_progress_a_hang(self):
        # The progress marks' folder went under $TMPDIR only: none was made, and ops did not count.
        env = {**WORKER_ENV, "TMPDIR": "/nonexistent-ddl-test"}
        result = ddl("-np", "2", "--hang-timeout", "8", "--", PYTHON, HANG_WORKER, "quiet_allreduces", "18", env=env, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("done"), 2)

    def test_report_shows_the_stacks_and_lets_the_run_go_on(self):
        result = ddl("-np", "2", "--hang-timeout", "6", "--hang-action", "report", "--", PYTHON, HANG_WORKER, "quiet", "12",
                     env=WORKER_ENV, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ddl: ranks 0-1: in <module> (hang_worker.py:", result.stderr)
        self.assertGreaterEqual(result.stderr.count("(--hang-timeout); the stacks of every rank:"), 1)
        self.assertEqual(result.stdout.count("done"), 2)

    def test_a_native_worker_s_stack_comes_from_gdb_and_an_ended_rank_says_so(self):
        result = ddl("-np", "2", "--hang-timeout", "2", "--", "sh", "-c", 'if [ "$RANK" = 1 ]; then exit 0; fi; exec sleep 300',
                     timeout=120)
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertRegex(result.stderr, r"ddl: rank 0: in \S*(nanosleep|sleep)\S*")
        self.assertRegex(result.stderr, r"\n    Thread \"sleep\":\n      #0 ")
        self.assertIn("ddl: rank 1: no stack: it had ended, with exit code 0", result.stderr)

    def test_a_gdb_that_has_not_finished_in_time_is_said_so_not_blamed_on_ptrace(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_executable(tmp, "gdb", "#!/bin/sh\nexec sleep 60\n")  # a gdb slower than ddl's 10 s for native stacks
            result = ddl("-np", "1", "--hang-timeout", "2", "--", "sleep", "300", timeout=120,
                         env={"PATH": f"{tmp}:{os.environ['PATH']}"})
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertIn("ddl: rank 0: no stack: not a Python program started by ddl run, and gdb had not read its stack within 10 s",
                      result.stderr)

    def test_sigquit_shows_every_rank_s_stacks_then_stops_the_run(self):
        proc = subprocess.Popen([DDL, "run", "-np", "2", "--", PYTHON, HANG_WORKER, "quiet", "300"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **WORKER_ENV})
        try:
            self.assertEqual(proc.stdout.readline().strip()[4:], "ready")
            self.assertEqual(proc.stdout.readline().strip()[4:], "ready")
            proc.send_signal(signal.SIGQUIT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        self.assertEqual(proc.returncode, 128 + signal.SIGQUIT, err)
        self.assertIn("ddl: SIGQUIT: the stacks of every rank:\n", err)
        # Both in the script's body: together when both were in its sleep, apart when one was still printing.
        found = groups(err)
        self.assertIn(set(found), ({"ranks 0-1"}, {"rank 0", "rank 1"}), err)
        self.assertTrue(all(where.startswith("in <module> (hang_worker.py:") for where in found.values()), err)
        self.assertIn("ddl: interrupted by SIGQUIT", err)

    def test_time_stopped_with_ctrl_z_is_not_a_hang(self):
        ticking = "import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(1)\n"
        proc = subprocess.Popen([DDL, "run", "-np", "2", "--hang-timeout", "4", "--", PYTHON, "-c", ticking],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(proc.stdout.readline().strip()[4:], "0")
            proc.send_signal(signal.SIGTSTP)  # ddl stops its workers, then itself
            time.sleep(7)
            proc.send_signal(signal.SIGCONT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        self.assertEqual(proc.returncode, 0, err)
        self.assertNotIn("stacks", err)
        self.assertEqual(sorted(out.splitlines()).count("[0] 9"), 1)

    def test_without_the_flag_a_quiet_run_is_never_stopped(self):
        result = ddl("-np", "2", "--", PYTHON, HANG_WORKER, "quiet", "4", env=WORKER_ENV, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")

    def test_a_bad_hang_timeout_is_one_line_naming_the_flag(self):
        for value in ("0", "0.5", "-3", "soon"):
            with self.subTest(value=value):
                result = ddl("-np", "1", "--hang-timeout", value, "--", "true")
                self.assertEqual(result.returncode, 2, result.stderr)
                first, *rest = result.stderr.strip().splitlines()
                self.assertTrue(first.startswith("ddl: error: --hang-timeout"), result.stderr)
                self.assertTrue(all(line.startswith("hint: ") for line in rest), result.stderr)
        result = ddl("-np", "1", "--hang-action", "wait", "--", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--hang-action", result.stderr)


if __name__ == "__main__":
    unittest.main()
