"""`ddl run --report-stragglers [SECONDS]`: rank 0's libddl says which ranks the others waited for
(the ranks whose announcement of an op came in its last round of negotiation, and how much later).
A straggler is made on purpose: one rank sleeps before each allreduce. Here on this machine;
test_hosts.py has the same across the two hosts of the test bed, where the report names the
straggler's host."""
import os
import re
import subprocess
import unittest

from ddl_testing import DDL, PYTHON, SOURCE

STRAGGLER = os.path.join(SOURCE, "tests", "integration", "straggler_worker.py")
REPORT = re.compile(r"\[0\] ddl: stragglers over (\d+) op\(s\): rank (\d+) on (\S+) arrived last in (\d+)% of ops, median (\d+) ms later")


def ddl_run(*args, timeout=180):
    env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "build", "python"))
    return subprocess.run([DDL, "run", *args], capture_output=True, text=True, timeout=timeout, env=env)


def check_straggler_report(test, stderr, rank, host):
    """That rank 0's report at the end names `rank` on `host` as the one nearly every op waited for."""
    found = REPORT.search(stderr)
    test.assertIsNotNone(found, stderr)
    ops, late, on, share, median = found.groups()
    test.assertEqual((late, on), (str(rank), host), stderr)
    test.assertGreaterEqual(int(ops), 60, stderr)    # the 60 allreduces
    test.assertGreaterEqual(int(share), 80, stderr)  # nearly every op waited for it
    test.assertGreaterEqual(int(median), 10, stderr)  # about its 30 ms sleep, less the others' own time


class Stragglers(unittest.TestCase):
    def test_the_rank_that_sleeps_before_each_allreduce_is_named_with_how_long_the_others_waited(self):
        result = ddl_run("-np", "3", "--report-stragglers", "1", "--", PYTHON, STRAGGLER, "2", "60", "0.03")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        check_straggler_report(self, result.stderr, 2, os.uname().nodename)
        # Every second while it runs (60 x 30 ms), then the whole run's at the end.
        self.assertRegex(result.stderr, r"\[0\] ddl: so far, stragglers over \d+ op\(s\): rank 2 on ")
        self.assertEqual(len(REPORT.findall(result.stderr)), 1, result.stderr)

    def test_without_the_flag_nothing_is_reported(self):
        result = ddl_run("-np", "2", "--", PYTHON, STRAGGLER, "1", "10", "0.01")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertNotIn("stragglers", result.stderr)


if __name__ == "__main__":
    unittest.main()
