"""The README's C++ job: data-parallel MLP training on libddl (examples/cpp_train.cpp) under
`ddl run`: the loss falls and every rank ends with bit-identical weights."""
import os
import re
import subprocess
import unittest

from ddl_testing import ddl, lines_by_rank

TRAIN = os.environ.get("DDL_CPP_TRAIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "examples", "cpp_train"))
EPOCH = re.compile(r"^epoch (\d+)/(\d+) loss ([\d.e+-]+)")
IDENTICAL = re.compile(r"^replicas identical: yes \(checksum ([0-9a-f]{16})\)$")


def losses_and_checksum(rank0_lines):
    losses = [float(m[3]) for m in map(EPOCH.match, rank0_lines) if m]
    checksums = [m[1] for m in map(IDENTICAL.match, rank0_lines) if m]
    return losses, checksums


class CppTrain(unittest.TestCase):
    def test_three_workers_learn_and_agree(self):
        result = ddl("-np", "3", "--", TRAIN, "--epochs", "4", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
        losses, checksums = losses_and_checksum(lines_by_rank(result.stdout)[0])
        self.assertEqual(len(losses), 5)  # before training and after each epoch
        self.assertLess(losses[-1], losses[0] / 3, "the loss falls")
        self.assertEqual(len(checksums), 1)

    def test_without_a_launcher_it_trains_alone(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDL_")}
        result = subprocess.run([TRAIN, "--epochs", "2"], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        losses, checksums = losses_and_checksum(result.stdout.splitlines())
        self.assertLess(losses[-1], losses[0])
        self.assertEqual(len(checksums), 1)


if __name__ == "__main__":
    unittest.main()
