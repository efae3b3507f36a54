"""The README's main job: PyTorch DDP (gloo, CPU) under `ddl run -np 4`, checked from outside."""
import os
import re
import unittest

from ddl_testing import PYTHON, ddl, lines_by_rank

EXAMPLE = os.path.join(os.environ.get("DDL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                       "examples", "pytorch_ddp.py")
ALLREDUCE = re.compile(r"^allreduce check: rank (\d+) world (\d+) got \[([-\d.e+]+), ([-\d.e+]+)\]")
EPOCH = re.compile(r"^epoch (\d+)/(\d+) loss ([\d.e+-]+)$")


class PyTorchDDP(unittest.TestCase):
    def run_example(self, workers, epochs):
        result = ddl("-np", str(workers), "--", PYTHON, EXAMPLE, "--epochs", str(epochs), timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        return lines_by_rank(result.stdout)

    def test_four_workers_allreduce_train_and_end_with_identical_replicas(self):
        workers = 4
        by_rank = self.run_example(workers, epochs=4)
        # The gloo all-reduce of [r+1, 10(r+1)] over ranks r = 0..3, worked out here: 1+2+3+4 = 10.
        expected = (sum(r + 1 for r in range(workers)), sum(10 * (r + 1) for r in range(workers)))
        self.assertEqual(expected, (10, 100))
        for rank in range(workers):
            checks = [m for m in map(ALLREDUCE.match, by_rank.get(rank, [])) if m]
            self.assertEqual(len(checks), 1, f"rank {rank} printed no all-reduce result")
            m = checks[0]
            self.assertEqual((int(m[1]), int(m[2])), (rank, workers))
            self.assertEqual((float(m[3]), float(m[4])), expected)
        losses = [float(m[3]) for m in map(EPOCH.match, by_rank[0]) if m]
        self.assertEqual(len(losses), 4)
        self.assertLess(losses[-1], losses[0], "the loss falls")
        self.assertTrue(any(line.startswith("replicas identical: yes") for line in by_rank[0]))


if __name__ == "__main__":
    unittest.main()
