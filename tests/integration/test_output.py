"""Worker output reaches ddl's stdout/stderr line by line, whole, prefixed with the rank."""
import os
import re
import select
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, PYTHON, ddl

# Each worker writes many long lines to both streams as fast as it can, in pieces, so that lines
# of different workers would splice if ddl forwarded bytes instead of lines.
NOISY = r"""
import os, sys
rank = os.environ["RANK"]
for i in range(2000):
    body = f"{rank}:{i}:" + "x" * (100 + i % 300)
    for stream in (sys.stdout, sys.stderr):
        stream.write(body[:50]); stream.flush()
        stream.write(body[50:] + "\n"); stream.flush()
sys.stdout.write("no newline at the end from " + rank)
"""
LINE = re.compile(r"^\[(\d)\] (\d):(\d+):(x+)$")


class Output(unittest.TestCase):
    def check_stream(self, text, workers):
        seen = {r: 0 for r in range(workers)}
        for line in text.splitlines():
            if line.startswith("[") and "no newline" in line:
                continue
            m = LINE.match(line)
            self.assertIsNotNone(m, f"spliced or damaged line: {line[:120]!r}")
            rank, body_rank, i, xs = int(m[1]), int(m[2]), int(m[3]), m[4]
            self.assertEqual(rank, body_rank, line[:80])
            self.assertEqual(len(xs), 100 + i % 300, "the whole line arrived")
            self.assertEqual(i, seen[rank], "lines of one worker keep their order")
            seen[rank] += 1
        self.assertEqual(seen, {r: 2000 for r in range(workers)})

    def test_lines_are_whole_prefixed_and_in_order_on_both_streams(self):
        result = ddl("-np", "4", "--", PYTHON, "-c", NOISY, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.check_stream(result.stdout, 4)
        self.check_stream(result.stderr, 4)
        for rank in range(4):  # an unfinished last line still arrives, as a line of its own
            self.assertIn(f"[{rank}] no newline at the end from {rank}\n", result.stdout)

    def test_prefix_can_be_switched_off(self):
        result = ddl("-np", "2", "--no-prefix", "--", "sh", "-c", 'echo "plain $RANK"')
        self.assertEqual(sorted(result.stdout.splitlines()), ["plain 0", "plain 1"])

    def test_output_dir_gets_one_file_per_rank_and_stream(self):
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = os.path.join(tmp, "logs", "run1")
            result = ddl("-np", "3", "--output-dir", out_dir, "--", "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2')
            self.assertEqual(result.returncode, 0)
            for rank in range(3):
                with open(os.path.join(out_dir, f"rank.{rank}.out")) as f:
                    self.assertEqual(f.read(), f"out {rank}\n")
                with open(os.path.join(out_dir, f"rank.{rank}.err")) as f:
                    self.assertEqual(f.read(), f"err {rank}\n")
            self.assertIn("[1] out 1", result.stdout)

    def test_an_unwritable_output_dir_is_an_error_naming_the_flag(self):
        with tempfile.NamedTemporaryFile() as f:
            result = ddl("-np", "1", "--output-dir", os.path.join(f.name, "sub"), "--", "true")
        self.assertEqual(result.returncode, 1)
        self.assertTrue(result.stderr.startswith("ddl: error: --output-dir: cannot create"), result.stderr)


    def test_a_progress_bar_redrawn_with_carriage_returns_shows_while_the_worker_runs(self):
        # tqdm's way: "\r" + the bar, no newline until the end. Each redraw must reach ddl's output
        # while the worker still runs (they were held until it exited), prefixed, ending in "\r".
        script = ("import sys, time\n"
                  "for p in (10, 50):\n"
                  "    sys.stderr.write(f'\\rprogress {p}%'); sys.stderr.flush(); time.sleep(0.2)\n"
                  "sys.stderr.write('\\rprogress 99%'); sys.stderr.flush()\n"
                  "time.sleep(30)\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        proc = subprocess.Popen([DDL, "run", "-np", "1", "--", PYTHON, "-c", script], stderr=subprocess.PIPE, env=env)
        try:
            seen = b""
            deadline = time.monotonic() + 20
            while b"[0] progress 50%\r" not in seen and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stderr], [], [], 1)
                if ready:
                    seen += os.read(proc.stderr.fileno(), 4096)
            self.assertIn(b"[0] progress 10%\r[0] progress 50%\r", seen)
            self.assertIsNone(proc.poll(), "the worker should still be running")
        finally:
            proc.terminate()  # ddl stops its worker on SIGTERM
            proc.wait(timeout=60)


if __name__ == "__main__":
    unittest.main()
