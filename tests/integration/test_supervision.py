"""Fail-fast, signals and clean-up of `ddl run`, checked against the real process table."""
import os
import signal
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, ddl, kill_leftovers, processes_with, unique_marker, wait_until


def start_ddl(*args):
    """Starts `ddl run ARGS` in its own session, as a terminal would start a foreground job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    return subprocess.Popen([DDL, "run", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


class FailFast(unittest.TestCase):
    def setUp(self):
        self.marker = None

    def tearDown(self):
        if self.marker:
            kill_leftovers(self.marker)

    def test_one_worker_exits_7_the_sleepers_are_stopped_and_ddl_exits_7(self):
        self.marker = marker = unique_marker()
        # Each sleeper also forks a grandchild sleeper: both must be gone afterwards.
        script = (f'if [ "$RANK" = 2 ]; then sleep 0.5; echo "rank two failing" >&2; exit 7; fi; '
                  f'sleep {marker} & sleep {marker}; wait')
        start = time.monotonic()
        result = ddl("-np", "4", "--grace-period", "5", "--", "sh", "-c", script, timeout=60)
        took = time.monotonic() - start
        self.assertEqual(result.returncode, 7, result.stderr)
        self.assertLess(took, 5 + 2)
        self.assertEqual(processes_with(marker), [])
        self.assertIn("ddl: error: rank 2 on ", result.stderr)
        self.assertIn("exited with code 7; stopped 3 other worker(s)", result.stderr)
        self.assertIn("  | rank two failing", result.stderr)

    def test_a_worker_killed_by_a_signal_gives_128_plus_signal(self):
        result = ddl("-np", "2", "--", "sh", "-c", 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 30', timeout=60)
        self.assertEqual(result.returncode, 128 + 9)
        self.assertIn("rank 1 on ", result.stderr)
        self.assertIn("was killed by SIGKILL (exit code 137)", result.stderr)

    def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(self):
        self.marker = marker = unique_marker()
        script = f'if [ "$RANK" = 0 ]; then sleep 0.3; exit 3; fi; trap "" TERM; sleep {marker}'
        start = time.monotonic()
        result = ddl("-np", "2", "--grace-period", "1", "--", "sh", "-c", script, timeout=60)
        took = time.monotonic() - start
        self.assertEqual(result.returncode, 3)
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 1 + 2)
        self.assertEqual(processes_with(marker), [])

    def test_all_workers_succeeding_gives_0(self):
        result = ddl("-np", "3", "--", "sh", "-c", "exit 0")
        self.assertEqual(result.returncode, 0)
        self.assertEqual(result.stderr, "")

    def test_a_grandchild_that_left_the_session_is_not_left_behind(self):
        self.marker = marker = unique_marker()
        result = ddl("-np", "2", "--", "sh", "-c", f"setsid sleep {marker} > /dev/null 2>&1 & exit 0", timeout=60)
        self.assertEqual(result.returncode, 0)
        self.assertEqual(processes_with(marker), [])


class MissingProgram(unittest.TestCase):
    def test_a_program_that_does_not_exist_is_a_one_line_error_and_127(self):
        start = time.monotonic()
        result = ddl("-np", "4", "--", "no-such-program-ddl-test", "arg")
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(result.returncode, 127)
        self.assertEqual(result.stdout, "")
        self.assertTrue(result.stderr.startswith("ddl: error: program 'no-such-program-ddl-test' was not found in PATH\n"))

    def test_a_file_that_is_not_executable_is_127_too(self):
        with tempfile.NamedTemporaryFile(suffix=".sh") as f:
            result = ddl("-np", "2", "--", f.name)
        self.assertEqual(result.returncode, 127)
        self.assertIn(f"program '{f.name}' is not an executable file", result.stderr)


class Signals(unittest.TestCase):
    def setUp(self):
        self.marker = unique_marker()
        self.script = f"sleep {self.marker} & sleep {self.marker}; wait"

    def tearDown(self):
        kill_leftovers(self.marker)

    def wait_for_workers(self, count):
        self.assertTrue(wait_until(lambda: len(processes_with(self.marker)) >= count, 10), "workers did not start")

    def test_ctrl_c_reaches_every_worker_and_leaves_no_orphan(self):
        proc = start_ddl("-np", "3", "--", "sh", "-c", self.script)
        self.wait_for_workers(6)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        self.assertIn("ddl: interrupted by SIGINT; stopped 3 worker(s)", err)
        self.assertEqual(processes_with(self.marker), [])

    def test_sigterm_reaches_every_worker(self):
        proc = start_ddl("-np", "2", "--", "sh", "-c", self.script)
        self.wait_for_workers(4)
        proc.terminate()
        proc.communicate(timeout=15)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM)
        self.assertEqual(processes_with(self.marker), [])

    def test_a_second_ctrl_c_kills_at_once(self):
        stubborn = f'trap "" INT TERM; sleep {self.marker}'
        proc = start_ddl("-np", "2", "--grace-period", "60", "--", "sh", "-c", stubborn)
        self.wait_for_workers(2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        self.assertIsNone(proc.poll(), "workers ignore SIGINT: ddl must still be waiting")
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=15)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        self.assertEqual(processes_with(self.marker), [])

    def test_workers_die_with_a_killed_launcher(self):
        proc = start_ddl("-np", "2", "--", "sleep", self.marker)
        self.wait_for_workers(2)
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 5))


if __name__ == "__main__":
    unittest.main()
