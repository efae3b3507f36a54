"""PyTorch Lightning's Trainer (strategy="ddp", CPU) under `ddl run -np 2`, checked from outside:
Lightning takes ddl's ranks through TORCHELASTIC_RUN_ID and starts no workers of its own.

Lightning lives in its own venv on top of Debian's torch (scripts/lightning_venv.sh), found through
DDL_LIGHTNING_PYTHON (set by ctest) or at the script's default place."""
import os
import re
import unittest

from ddl_testing import ddl, lines_by_rank

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "lightning_train.py")
VENV_PYTHON = os.environ.get("DDL_LIGHTNING_PYTHON") or "/var/cache/ddl/lightning-venv/bin/python"
REPORT = re.compile(r"^lightning rank (\d+) of (\d+) local (\d+) node (\d+) weights ([0-9a-f]{64})$")


class Lightning(unittest.TestCase):
    def setUp(self):
        if not os.access(VENV_PYTHON, os.X_OK):
            self.fail(f"no Lightning venv: {VENV_PYTHON} is missing; run `bash scripts/lightning_venv.sh` "
                      "(it creates /var/cache/ddl/lightning-venv, or $DDL_LIGHTNING_VENV) and set "
                      "DDL_LIGHTNING_PYTHON to its bin/python if it is not at the default place")

    def test_ddp_trainer_takes_ddl_ranks_and_ends_with_identical_weights(self):
        workers = 2
        # Importing Lightning alone takes 10+ s on a slow machine; two of them share its cores.
        result = ddl("-np", str(workers), "--", VENV_PYTHON, TRAIN, timeout=480, cwd=HERE)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, output[-4000:])
        by_rank = lines_by_rank(result.stdout)
        hashes = set()
        for rank in range(workers):
            reports = [m for m in map(REPORT.match, by_rank.get(rank, [])) if m]
            self.assertEqual(len(reports), 1, f"rank {rank} printed no (or several) Lightning reports:\n{output[-4000:]}")
            m = reports[0]
            # Lightning's global/local/node rank is ddl's rank (the line's prefix), its world ddl's -np.
            self.assertEqual((int(m[1]), int(m[2]), int(m[3]), int(m[4])), (rank, workers, rank, 0))
            hashes.add(m[5])
        self.assertEqual(len(hashes), 1, f"the ranks' weights differ: {hashes}")
        self.assertEqual(sorted(k for k in by_rank if k is not None), list(range(workers)),
                         "only ranks 0 and 1 print: Lightning started no processes of its own")
        slurm_lines = [line for line in output.splitlines() if re.search(r"srun|slurm", line, re.IGNORECASE)]
        self.assertEqual(slurm_lines, [], "Lightning mentions srun/SLURM under ddl run")


if __name__ == "__main__":
    unittest.main()
