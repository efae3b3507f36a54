"""Worker output reaches ddl's stdout/stderr line by line, whole, prefixed with the rank."""
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, PYTHON, ddl, is_stopped, wait_until

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
LINE = re.compile(r"^\[(\d)\] (.*)$")
BODY = re.compile(r"^(\d):(\d+):(x+)$")


class Output(unittest.TestCase):
    def check_stream(self, text, workers):
        seen = {r: 0 for r in range(workers)}
        # A worker paused over 100 ms between a line's two pieces has its first piece shown early,
        # and another rank's line may then end it (issue 22): the rest comes as a prefixed line of its
        # own. Each output line must still hold one rank's text, which joins back up in order.
        unfinished = {r: "" for r in range(workers)}
        for line in text.splitlines():
            if line.startswith("[") and "no newline" in line:
                continue
            m = LINE.match(line)
            self.assertIsNotNone(m, f"a line without its prefix: {line[:120]!r}")
            rank = int(m[1])
            body = unfinished[rank] + m[2]
            b = BODY.match(body)
            if b is None or len(b[3]) < 100 + int(b[2]) % 300:
                self.assertLess(len(body), 50 + 1, f"spliced or damaged line: {line[:120]!r}")
                unfinished[rank] = body
                continue
            unfinished[rank] = ""
            body_rank, i, xs = int(b[1]), int(b[2]), b[3]
            self.assertEqual(rank, body_rank, line[:80])
            self.assertEqual(len(xs), 100 + i % 300, "the whole line arrived")
            self.assertEqual(i, seen[rank], "lines of one worker keep their order")
            seen[rank] += 1
        self.assertEqual(seen, {r: 2000 for r in range(workers)})
        self.assertEqual(unfinished, {r: "" for r in range(workers)}, "every piece joined a whole line")

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

    def test_prefix_host_labels_each_line_with_host_and_rank(self):
        result = ddl("-np", "2", "--prefix", "host", "--", "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2')
        self.assertEqual(result.returncode, 0, result.stderr)
        host = socket.gethostname()
        self.assertEqual(sorted(result.stdout.splitlines()), [f"[{host}:0] out 0", f"[{host}:1] out 1"])
        self.assertEqual(sorted(result.stderr.splitlines()), [f"[{host}:0] err 0", f"[{host}:1] err 1"])
        plain = ddl("-np", "2", "--prefix", "none", "--", "sh", "-c", 'echo "plain $RANK"')
        self.assertEqual(sorted(plain.stdout.splitlines()), ["plain 0", "plain 1"])
        both = ddl("-np", "2", "--prefix", "host", "--no-prefix", "--", "true")
        self.assertEqual(both.returncode, 2, both.stderr)
        self.assertIn("--prefix", both.stderr)

    def test_ranks_shows_only_those_ranks_and_every_rank_still_gets_its_files(self):
        with tempfile.TemporaryDirectory() as out_dir:
            result = ddl("-np", "4", "--ranks", "0,2-3", "--output-dir", out_dir, "--", "sh", "-c",
                         'echo "out $RANK"; echo "err $RANK" >&2')
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(sorted(result.stdout.splitlines()), ["[0] out 0", "[2] out 2", "[3] out 3"])
            self.assertEqual(sorted(result.stderr.splitlines()), ["[0] err 0", "[2] err 2", "[3] err 3"])
            for rank in range(4):
                with open(os.path.join(out_dir, f"rank.{rank}.out")) as f:
                    self.assertEqual(f.read(), f"out {rank}\n")

    def test_a_failing_rank_that_ranks_hides_still_shows_its_last_lines_in_the_error(self):
        # Rank 1 fails only once rank 0's line is written, so that the stop cannot come before it.
        with tempfile.TemporaryDirectory() as scratch:
            ready = os.path.join(scratch, "rank0-wrote")
            script = (f'if [ "$RANK" = 1 ]; then while [ ! -e {ready} ]; do sleep 0.05; done; '
                      'echo "rank 1 gives up" >&2; exit 3; fi; '
                      f'echo "rank $RANK waits"; touch {ready}; exec sleep 30')
            result = ddl("-np", "2", "--ranks", "0", "--grace-period", "2", "--", "sh", "-c", script, timeout=60)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertEqual(result.stdout, "[0] rank 0 waits\n")
        self.assertNotIn("[1]", result.stderr)
        self.assertIn("ddl: error: rank 1 on ", result.stderr)
        self.assertIn("\n  | rank 1 gives up\n", result.stderr)

    def test_bad_ranks_get_one_line_naming_the_flag_and_nothing_runs(self):
        for value, says in (("2", "--ranks 2: rank 2 is not in this run, whose ranks are 0-1"),
                            ("1-x", "--ranks '1-x': 'x' is not a rank"),
                            ("3-1", "--ranks '3-1': the range '3-1' ends before it starts"),
                            ("0,,1", "--ranks '0,,1': '' is not a rank"),
                            ("", "--ranks")):
            with self.subTest(value=value):
                result = ddl("-np", "2", "--ranks", value, "--", "sh", "-c", "echo ran")
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(says, result.stderr.splitlines()[0])
                self.assertEqual(result.stdout, "")

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

    def test_a_line_longer_than_64_kib_arrives_whole_with_no_line_end_added(self):
        script = "import sys; sys.stdout.write('c' * 200000 + '\\n' + 'd' * 70000); sys.stdout.flush()"
        with tempfile.TemporaryDirectory() as tmp:
            result = ddl("-np", "1", "--output-dir", tmp, "--", PYTHON, "-c", script)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            with open(os.path.join(tmp, "rank.0.out")) as f:
                # (the file holds what the worker wrote: an unfinished last line is ended on the terminal only)
                self.assertEqual(f.read(), "c" * 200000 + "\n" + "d" * 70000)
        self.assertEqual(result.stdout, "[0] " + "c" * 200000 + "\n[0] " + "d" * 70000 + "\n")

    def test_output_dir_files_hold_exactly_the_bytes_each_stream_got(self):
        # Random bytes (carriage returns, CRLF, a \r opening a line, NULs, invalid UTF-8) and no last
        # newline, on both streams, written in pieces of odd sizes; and a file of "abc" through cat.
        script = ("import os, random, sys\n"
                  "rank = int(os.environ['RANK'])\n"
                  "for fd, seed in ((1, rank), (2, 100 + rank)):\n"
                  "    data = random.Random(seed).randbytes(200000) + b'\\r\\n\\rend\\r'\n"
                  "    for i in range(0, len(data), 7919):\n"
                  "        os.write(fd, data[i:i + 7919])\n")
        with tempfile.TemporaryDirectory() as tmp:
            # (bytes: the terminal view holds invalid UTF-8 too)
            result = subprocess.run([DDL, "run", "-np", "2", "--output-dir", tmp, "--", PYTHON, "-c", script],
                                    capture_output=True, timeout=120,
                                    env={k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))})
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            for rank in range(2):
                for suffix, seed in (("out", rank), ("err", 100 + rank)):
                    with open(os.path.join(tmp, f"rank.{rank}.{suffix}"), "rb") as f:
                        written = random.Random(seed).randbytes(200000) + b"\r\n\rend\r"
                        self.assertTrue(f.read() == written, f"rank.{rank}.{suffix} differs from what rank {rank} wrote")
            with open(os.path.join(tmp, "x.txt"), "w") as f:
                f.write("abc")
            result = ddl("-np", "1", "--output-dir", tmp, "--", "cat", os.path.join(tmp, "x.txt"))
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(tmp, "rank.0.out"), "rb") as f:
                self.assertEqual(f.read(), b"abc")
            self.assertEqual(result.stdout, "[0] abc\n")  # the terminal view ends the line

    def test_running_out_of_open_files_names_the_limit_and_ulimit(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run(
                ["sh", "-c", f'ulimit -n 64 && exec "$0" run -np 40 --output-dir {tmp}/o -- true', DDL],
                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        lines = result.stderr.splitlines()
        self.assertTrue(lines[0].startswith("ddl: error: --output-dir: cannot write") and lines[0].endswith("Too many open files"),
                        result.stderr)
        self.assertIn("under a limit of 64 (ulimit -n)", lines[1])

    def test_a_run_that_cannot_start_leaves_the_last_run_s_output_files_as_they_were(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = ddl("-np", "4", "--output-dir", tmp, "--", "sh", "-c", 'echo "good run $RANK"; echo "err $RANK" >&2')
            self.assertEqual(good.returncode, 0, good.stderr)
            # 20 open files: enough for the 8 files, not for every worker's pipes as well.
            failed = subprocess.run(["sh", "-c", f'ulimit -n 20 && exec "$0" run -np 4 --output-dir {tmp} -- sh -c "echo bad"', DDL],
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(failed.returncode, 1, failed.stderr)
            self.assertIn("cannot create a pipe for a worker: Too many open files", failed.stderr)  # after the files opened
            for rank in range(4):
                with open(os.path.join(tmp, f"rank.{rank}.out")) as f:
                    self.assertEqual(f.read(), f"good run {rank}\n")
                with open(os.path.join(tmp, f"rank.{rank}.err")) as f:
                    self.assertEqual(f.read(), f"err {rank}\n")
            shorter = ddl("-np", "1", "--output-dir", tmp, "--", "echo", "x")  # a run that starts empties its files first
            self.assertEqual(shorter.returncode, 0, shorter.stderr)
            with open(os.path.join(tmp, "rank.0.out")) as f:
                self.assertEqual(f.read(), "x\n")

    def test_an_unwritable_output_dir_is_an_error_naming_the_flag(self):
        with tempfile.NamedTemporaryFile() as f:
            result = ddl("-np", "1", "--output-dir", os.path.join(f.name, "sub"), "--", "true")
        self.assertEqual(result.returncode, 1)
        self.assertTrue(result.stderr.startswith("ddl: error: --output-dir: cannot create"), result.stderr)


    def test_an_output_file_that_cannot_be_written_stops_the_run_before_any_worker_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            os.makedirs(os.path.join(out, "rank.1.out"))  # a directory where rank 1's file goes
            touched = os.path.join(tmp, "ran")
            result = ddl("-np", "2", "--output-dir", out, "--", "touch", touched, timeout=60)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn(f"--output-dir: cannot write {out}/rank.1.out", result.stderr)
            self.assertFalse(os.path.exists(touched), "a worker ran before the run was refused")

    def test_an_output_file_that_fails_mid_run_is_given_up_with_one_warning_and_the_run_goes_on(self):
        # /dev/full stands for a disk that fills up: every write fails with ENOSPC.
        with tempfile.TemporaryDirectory() as tmp:
            os.symlink("/dev/full", os.path.join(tmp, "rank.0.out"))
            result = ddl("-np", "2", "--output-dir", tmp, "--", "sh", "-c", 'echo "a $RANK"; echo "b $RANK"', timeout=60)
            with open(os.path.join(tmp, "rank.1.out")) as f:
                rank_1_file = f.read()
        self.assertEqual(result.returncode, 0, result.stderr)
        warnings = [line for line in result.stderr.splitlines() if line.startswith("ddl: warning: --output-dir")]
        self.assertEqual(warnings, [f"ddl: warning: --output-dir: cannot write {tmp}/rank.0.out: No space left on "
                                    "device; rank 0's output goes on to ddl's own only"], result.stderr)
        self.assertEqual([line for line in result.stdout.splitlines() if line.startswith("[0]")], ["[0] a 0", "[0] b 0"])
        self.assertEqual(rank_1_file, "a 1\nb 1\n")

    def test_ddl_s_own_output_that_cannot_be_written_is_an_error_not_a_cut_short_file(self):
        # /dev/full stands for a full disk under `ddl submit --dry-run > job.sh`.
        for args in (["submit", "--site", "slurm", "--dry-run", "--", "python3", "train.py"], ["sites"], ["--version"]):
            with self.subTest(args=args), open("/dev/full", "w") as full:
                result = subprocess.run([DDL, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertTrue(result.stderr.startswith("ddl: error: cannot write standard output: "), result.stderr)

    def test_workers_output_that_cannot_be_written_is_said_once_and_the_run_goes_on(self):
        with open("/dev/full", "w") as full:
            result = subprocess.run([DDL, "run", "-np", "2", "--", "sh", "-c", "echo a; echo b"], stdout=full,
                                    stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "ddl: warning: cannot write standard output: No space left on device; "
                                        "the workers' output to it is lost\n")

    def test_a_reader_that_goes_away_ends_the_run_as_a_pipe_ends_a_writer(self):
        # `ddl run -- yes | head -1`: the workers get SIGPIPE, as without ddl, instead of writing
        # into nothing forever.
        proc = subprocess.Popen([DDL, "run", "-np", "2", "--", "yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.readline()
        proc.stdout.close()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            self.fail("ddl run went on after its reader had gone")
        self.assertEqual(first, b"[0] y\n" if first.startswith(b"[0]") else b"[1] y\n")
        self.assertEqual(proc.returncode, 128 + 13, err)
        self.assertIn(b"killed by SIGPIPE", err)

    def test_a_reader_that_goes_away_is_not_a_failure_to_restart_from(self):
        # --max-restarts started every worker again, three times, each to die at its first print.
        proc = subprocess.Popen([DDL, "run", "-np", "2", "--max-restarts", "3", "--", "yes"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.readline()
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 128 + 13, err)
        self.assertNotIn(b"restarting all workers", err)

    def test_a_python_worker_whose_reader_went_away_ends_the_run_with_its_own_1(self):
        # As docs/run.md says: Python ignores SIGPIPE, raises BrokenPipeError and exits with 1.
        proc = subprocess.Popen([DDL, "run", "-np", "1", "--", PYTHON, "-c", "while True: print('y' * 100)"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.readline()
        proc.stdout.close()
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn(b"BrokenPipeError", err)

    def test_a_slow_reader_still_gets_every_line_and_each_last_unfinished_one(self):
        # Far more than the pipes hold is still unread when the workers end: ddl reads on while
        # the reader keeps taking it, then passes on each worker's last line without its end.
        worker = ('import os, sys\nr = os.environ["RANK"]\nfor i in range(1200): print(r, i, "q" * 100)\n'
                  'sys.stdout.write(f"TAIL_{r}"); sys.stdout.flush()\n')
        reader = "import sys, time\nwhile b := sys.stdin.buffer.read1(4096):\n    sys.stdout.buffer.write(b); time.sleep(0.05)\n"
        result = subprocess.run(f"{DDL} run -np 4 -- {PYTHON} -c '{worker}' | {PYTHON} -c '{reader}'", shell=True,
                                capture_output=True, text=True, timeout=120)
        lines = result.stdout.splitlines()
        for rank in ("0", "1", "2", "3"):
            self.assertEqual(len([line for line in lines if line.startswith(f"[{rank}] {rank} ")]), 1200)
            self.assertIn(f"[{rank}] TAIL_{rank}", lines)

    def test_started_without_a_stdout_ddl_runs_its_workers_and_ends_as_they_do(self):
        # With descriptor 1 closed, the next one ddl opened took its number and got the workers' output.
        result = subprocess.run(f"{DDL} run -np 2 -- sh -c 'echo out; echo err >&2; exit 0' >&-", shell=True, capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(result.stderr.splitlines()), ["[0] err", "[1] err"])

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

def running(pid):
    """Whether `pid` is a process that has not ended (a zombie has: only its reaping is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class UnreadOutput(unittest.TestCase):
    """ddl's stdout is a pipe nobody reads (a paused pager, `ddl run ... | sleep 600`): what ddl has
    to write waits for its reader, while signals and a failed worker are acted on at once."""

    def start_with_unread_stdout(self, tmp, worker_tail):
        # Each worker notes its pid, then writes to stdout as fast as it can.
        worker = (f'import os, sys, time\nopen("{tmp}/pid." + os.environ["RANK"], "w").write(str(os.getpid()))\n'
                  f'{worker_tail}\nwhile True: print("x" * 200, flush=True)\n')
        read_end, write_end = os.pipe()
        proc = subprocess.Popen([DDL, "run", "-np", "2", "--grace-period", "5", "--", PYTHON, "-c", worker],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, start_new_session=True)
        os.close(write_end)
        pid_files = [os.path.join(tmp, f"pid.{rank}") for rank in (0, 1)]
        self.assertTrue(wait_until(lambda: all(os.path.exists(p) and os.path.getsize(p) > 0 for p in pid_files), 60))
        pids = []
        for pid_file in pid_files:
            with open(pid_file) as f:
                pids.append(int(f.read()))
        self.addCleanup(lambda: [os.kill(pid, 9) for pid in pids if running(pid)])
        return proc, read_end, pids

    def finish(self, proc, read_end, pids):
        stopped = wait_until(lambda: not any(running(pid) for pid in pids), 20)
        os.close(read_end)  # the reader goes: what ddl still holds for it has nowhere to go
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            self.fail("ddl run did not end once its reader had gone")
        self.assertTrue(stopped, "the workers ran on while ddl waited for its reader")
        return err

    def test_sigterm_stops_the_workers_though_nobody_reads_the_output(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc, read_end, pids = self.start_with_unread_stdout(tmp, "")
            time.sleep(2)  # every pipe between the workers and the reader fills up
            proc.send_signal(signal.SIGTERM)
            err = self.finish(proc, read_end, pids)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err)

    def test_a_failed_worker_stops_the_others_though_nobody_reads_the_output(self):
        with tempfile.TemporaryDirectory() as tmp:
            fail_later = 'if os.environ["RANK"] == "1":\n    time.sleep(2); sys.exit(3)'
            proc, read_end, pids = self.start_with_unread_stdout(tmp, fail_later)
            err = self.finish(proc, read_end, pids)
        self.assertEqual(proc.returncode, 3, err)
        self.assertIn("rank 1 on ", err)


    def test_sigcont_while_output_waits_for_its_reader_after_the_workers_ended_changes_nothing(self):
        # Slurm sends SIGCONT with each signal it gives a job's shell; a Ctrl-Z (SIGTSTP) stops ddl
        # until it is continued. Neither stops a run whose workers all ended well.
        with tempfile.TemporaryDirectory() as tmp:
            done = os.path.join(tmp, "done")
            worker = f'import sys\nsys.stdout.write("y" * 3000000 + "\\n"); sys.stdout.flush()\nopen("{done}", "w")\n'
            read_end, write_end = os.pipe()
            proc = subprocess.Popen([DDL, "run", "-np", "1", "--no-prefix", "--", PYTHON, "-c", worker], stdout=write_end,
                                    stderr=subprocess.PIPE, start_new_session=True)
            os.close(write_end)
            self.assertTrue(wait_until(lambda: os.path.exists(done), 60))
            time.sleep(0.5)  # the worker has ended; ddl holds what its reader has not taken
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTSTP)
            self.assertTrue(wait_until(lambda: is_stopped(proc.pid), 10))
            proc.send_signal(signal.SIGCONT)
            with os.fdopen(read_end, "rb") as reader:
                got = reader.read()
            err = proc.communicate(timeout=30)[1].decode()
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(len(got), 3000001, err)
        self.assertNotIn("interrupted", err)


class PartialLines(unittest.TestCase):
    """Output without a line end is shown a short time (0.1 s) after it began to wait, and the
    display stays whole when the line goes on, ends or is redrawn."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.go = os.path.join(self.tmp, "go")  # the workers wait for it, so that only a live view shows what they wrote

    def start(self, *args, stream="stdout"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        proc = subprocess.Popen([DDL, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.addCleanup(self.stop, proc)
        return proc, (proc.stdout if stream == "stdout" else proc.stderr)

    def stop(self, proc):
        if proc.poll() is None:
            open(self.go, "w").close()
            proc.terminate()  # ddl stops its workers on SIGTERM
            proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()

    def read_until(self, proc, pipe, predicate, seen=b"", timeout=20):
        """Reads PIPE as the bytes come until PREDICATE(all read so far) holds or TIMEOUT passes."""
        deadline = time.monotonic() + timeout
        while not predicate(seen) and time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], 0.5)
            if ready:
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
        return seen

    def finish(self, proc, pipe, seen):
        """Lets the workers go on, and returns all the output they made."""
        open(self.go, "w").close()
        seen = self.read_until(proc, pipe, lambda _: False, seen, timeout=60)
        proc.wait(timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr.read().decode() if pipe is proc.stdout else "")
        return seen

    WAITING_WRITER = ("import os, sys, time\n"
                      "sys.stdout.write('Loading ' + os.environ['RANK'] + '...'); sys.stdout.flush()\n"
                      "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
                      "print(' done')\n")

    def test_text_without_a_line_end_shows_while_the_worker_waits_and_the_line_ends_once(self):
        proc, pipe = self.start("-np", "1", "--", PYTHON, "-c", self.WAITING_WRITER, self.go)
        seen = self.read_until(proc, pipe, lambda s: b"Loading 0..." in s)
        self.assertEqual(seen, b"[0] Loading 0...")
        self.assertIsNone(proc.poll(), "the worker should still be waiting")
        self.assertEqual(self.finish(proc, pipe, seen), b"[0] Loading 0... done\n")

    def test_without_prefixes_too(self):
        proc, pipe = self.start("-np", "1", "--no-prefix", "--", PYTHON, "-c", self.WAITING_WRITER, self.go)
        seen = self.read_until(proc, pipe, lambda s: b"Loading 0..." in s)
        self.assertEqual(seen, b"Loading 0...")
        self.assertIsNone(proc.poll(), "the worker should still be waiting")
        self.assertEqual(self.finish(proc, pipe, seen), b"Loading 0... done\n")

    def test_dots_written_without_pause_show_while_the_worker_goes_on_writing(self):
        # A dot every 50 ms, never quiet for 0.1 s: the line showed only at its end.
        script = ("import os, sys, time\n"
                  "while not os.path.exists(sys.argv[1]):\n"
                  "    sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.05)\n"
                  "print(' done')\n")
        proc, pipe = self.start("-np", "1", "--", PYTHON, "-c", script, self.go)
        seen = self.read_until(proc, pipe, lambda s: s.startswith(b"[0] ..."))
        self.assertTrue(seen.startswith(b"[0] ..."), seen)
        self.assertIsNone(proc.poll(), "the worker should still be writing")
        whole = self.finish(proc, pipe, seen)
        self.assertRegex(whole, rb"^\[0\] \.+ done\n$")

    def test_tqdm_shows_each_rank_s_current_percentage(self):
        script = ("import os, sys, time\n"
                  "from tqdm import tqdm\n"
                  "rank = os.environ['RANK']\n"
                  "bar = tqdm(total=4, desc='rank' + rank, mininterval=0, miniters=1, ascii=True, ncols=60)\n"
                  "for _ in range(2):\n"
                  "    time.sleep(0.2); bar.update(1)\n"
                  "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
                  "bar.update(2); bar.close()\n")
        proc, pipe = self.start("-np", "2", "--", PYTHON, "-c", script, self.go, stream="stderr")
        live = lambda s: all(re.search(rb"\[%d\] rank%d:  50%%" % (r, r), s) for r in (0, 1))
        seen = self.read_until(proc, pipe, live)
        self.assertTrue(live(seen), f"each rank's 50% should show while the workers wait: {seen!r}")
        self.assertIsNone(proc.poll(), "the workers should still be waiting")
        seen = self.finish(proc, pipe, seen)
        for line in seen.split(b"\n"):
            for shown in filter(None, line.split(b"\r")):  # what each redraw puts on the terminal line
                self.assertRegex(shown, rb"^\[(\d)\] rank\1: +\d+%\|[#0-9 ]*\| \d/4 \[", seen)
        for r in (0, 1):
            self.assertRegex(seen, rb"\[%d\] rank%d: 100%%\|#+\| 4/4 \[[^\r\n]*\n" % (r, r))

    def test_two_ranks_writing_unfinished_lines_at_once_stay_readable(self):
        script = ("import os, sys, time\n"
                  "rank = os.environ['RANK']\n"
                  "for i in range(4):\n"
                  "    sys.stdout.write(f'r{rank}-{i} '); sys.stdout.flush(); time.sleep(0.3)\n"
                  "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
                  "print('end', rank)\n")
        proc, pipe = self.start("-np", "2", "--", PYTHON, "-c", script, self.go)
        live = lambda s: b"r0-3 " in s and b"r1-3 " in s
        seen = self.read_until(proc, pipe, live)
        self.assertTrue(live(seen), f"both ranks' unfinished lines should show while the workers wait: {seen!r}")
        seen = self.finish(proc, pipe, seen).decode()
        self.assertTrue(seen.endswith("\n"), seen)
        pieces = {"0": "", "1": ""}
        for line in seen.splitlines():
            m = re.match(r"^\[(\d)\] ((?:r(\d)-\d )*(?:end \d)?)$", line)
            self.assertIsNotNone(m, f"a line with more than one prefix or rank: {line!r} in {seen!r}")
            self.assertNotRegex(m[2], rf"r[^{m[1]}]-|end [^{m[1]}]", f"another rank's text on the line of rank {m[1]}: {seen!r}")
            pieces[m[1]] += m[2]
        for r in ("0", "1"):  # each rank's text, in order, nothing lost or doubled
            self.assertEqual(pieces[r], f"r{r}-0 r{r}-1 r{r}-2 r{r}-3 end {r}")


if __name__ == "__main__":
    unittest.main()
