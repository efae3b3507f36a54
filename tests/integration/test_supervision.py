"""Fail-fast, signals and clean-up of `ddl run`, checked against the real process table."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, PYTHON, comm, ddl, is_stopped, kill_leftovers, processes_with, sleeps_with, unique_marker, wait_until, write_executable


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

    def test_a_failed_worker_s_endless_stderr_line_is_repeated_only_in_part(self):
        # 5 MB without a line end were kept whole (ddl's memory) and repeated in the summary.
        result = ddl("-np", "1", "--", PYTHON, "-c", "import sys; sys.stderr.write('E' * 5_000_000); sys.exit(3)", timeout=60)
        self.assertEqual(result.returncode, 3, result.stderr[-2000:])
        summary = result.stderr[result.stderr.index("ddl: error: rank 0"):]
        self.assertIn("  | " + "E" * 4096 + " [...]", summary)
        self.assertLess(len(summary), 10_000)

    def test_a_worker_killed_by_a_signal_gives_128_plus_signal(self):
        result = ddl("-np", "2", "--", "sh", "-c", 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 30', timeout=60)
        self.assertEqual(result.returncode, 128 + 9)
        self.assertIn("rank 1 on ", result.stderr)
        self.assertIn("was killed by SIGKILL (exit code 137)", result.stderr)

    def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(self):
        self.marker = marker = unique_marker()
        # Rank 0 fails only once rank 1 ignores SIGTERM (a file; bounded at 30 s): on a loaded machine
        # a fixed head start for rank 1 can be too short, and SIGTERM would end it before its trap.
        with tempfile.TemporaryDirectory() as tmp:
            script = (f'if [ "$RANK" = 0 ]; then i=0; while [ ! -e {tmp}/ready ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; '
                      f'exit 3; fi; trap "" TERM; touch {tmp}/ready; sleep {marker}')
            start = time.monotonic()
            result = ddl("-np", "2", "--grace-period", "1", "--", "sh", "-c", script, timeout=60)
            took = time.monotonic() - start
        self.assertEqual(result.returncode, 3)
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 1 + 10)  # the grace period, not a hang: ASan and a loaded machine slow the start-up
        self.assertEqual(processes_with(marker), [])

    def test_all_workers_succeeding_gives_0(self):
        result = ddl("-np", "3", "--", "sh", "-c", "exit 0")
        self.assertEqual(result.returncode, 0)
        self.assertEqual(result.stderr, "")

    def test_a_nul_byte_in_the_failed_ranks_stderr_does_not_cut_ddls_message_short(self):
        result = ddl("-np", "1", "--", PYTHON, "-c", "import os; os.write(2, b'first\\x00half\\nsecond line\\n'); os._exit(3)",
                     timeout=60)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("  | second line", result.stderr)

    def test_a_parent_that_ignores_sigchld_does_not_hang_ddl(self):
        # An ignored SIGCHLD is inherited across exec; the kernel then reaps the workers unseen.
        start = time.monotonic()
        result = subprocess.run([DDL, "run", "-np", "2", "--", "sh", "-c", "exit 3"], capture_output=True, text=True, timeout=60,
                                preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("exited with code 3", result.stderr)
        self.assertLess(time.monotonic() - start, 30)

    def test_a_grandchild_that_left_the_session_is_not_left_behind(self):
        self.marker = marker = unique_marker()
        result = ddl("-np", "2", "--", "sh", "-c", f"setsid sleep {marker} > /dev/null 2>&1 & exit 0", timeout=60)
        self.assertEqual(result.returncode, 0)
        self.assertEqual(processes_with(marker), [])


class MissingProgram(unittest.TestCase):
    def test_a_program_that_does_not_exist_is_a_one_line_error_and_127(self):
        start = time.monotonic()
        result = ddl("-np", "4", "--", "no-such-program-ddl-test", "arg")
        # Only that ddl refuses at once rather than hanging: 30 s leaves room for ASan and a loaded machine.
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(result.returncode, 127)
        self.assertEqual(result.stdout, "")
        self.assertTrue(result.stderr.startswith("ddl: error: program 'no-such-program-ddl-test' was not found in PATH\n"))

    def test_a_file_that_is_not_executable_is_127_too(self):
        with tempfile.NamedTemporaryFile(suffix=".sh") as f:
            result = ddl("-np", "2", "--", f.name)
        self.assertEqual(result.returncode, 127)
        self.assertIn(f"program '{f.name}' is not an executable file", result.stderr)


    def test_a_script_whose_interpreter_is_missing_is_named_as_such_before_any_worker_starts(self):
        with tempfile.TemporaryDirectory() as tmp:
            started = os.path.join(tmp, "started")
            missing = write_executable(tmp, "x.sh", f"#!/nonexistent/bash\ntouch {started}\n")
            result = ddl("-np", "2", "--", missing)
            self.assertEqual(result.returncode, 127)
            self.assertEqual(result.stdout, "")
            self.assertEqual(result.stderr.splitlines()[0], f"ddl: error: program '{missing}' names the interpreter "
                             "'/nonexistent/bash' on its #! line, which does not exist")
            windows = write_executable(tmp, "y.sh", f"#!/bin/sh\r\ntouch {started}\r\n")
            result = ddl("-np", "2", "--", windows)
            self.assertEqual(result.returncode, 127)
            self.assertIn("has a #! line that ends in a carriage return (Windows line ends)", result.stderr)
            self.assertIn(f"dos2unix {windows}", result.stderr)
            self.assertFalse(os.path.exists(started), "a worker started")
            spaced = write_executable(tmp, "z.sh", f"#! /bin/sh -e\ntouch {started}\n")
            self.assertEqual(ddl("-np", "1", "--", spaced).returncode, 0)
            self.assertTrue(os.path.exists(started))


class Signals(unittest.TestCase):
    def setUp(self):
        self.marker = unique_marker()
        self.script = f"sleep {self.marker} & sleep {self.marker}; wait"

    def tearDown(self):
        kill_leftovers(self.marker)

    def wait_for_workers(self, count):
        """Waits for COUNT `sleep`s: ddl, the shells and a worker not yet past exec carry the marker
        too, and a shell signalled before its `trap` would die of it."""
        self.assertTrue(wait_until(lambda: len(sleeps_with(self.marker)) >= count, 30), "workers did not start")

    def test_ctrl_c_reaches_every_worker_and_leaves_no_orphan(self):
        proc = start_ddl("-np", "3", "--", "sh", "-c", self.script)
        self.wait_for_workers(6)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        self.assertEqual(proc.returncode, -signal.SIGINT)  # dies of it, so a shell loop of runs stops
        self.assertIn("ddl: interrupted by SIGINT; stopped 3 worker(s)", err)
        self.assertEqual(processes_with(self.marker), [])

    def test_ctrl_c_stops_a_shell_loop_of_runs(self):
        # The terminal's SIGINT reaches the whole foreground group, the shell too; a shell goes on
        # with its loop after a child that exited (with 130), and stops after one that died of it.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        loop = f'for i in 1 2 3; do "{DDL}" run -np 1 -- sleep {self.marker}; echo "after run $i"; done'
        proc = subprocess.Popen(["bash", "-c", loop], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.wait_for_workers(1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        self.assertEqual(proc.returncode, -signal.SIGINT, out + err)
        self.assertNotIn("after run", out)
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
        self.wait_for_workers(2)  # both sleeps, which start after the trap
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        self.assertIsNone(proc.poll(), "workers ignore SIGINT: ddl must still be waiting")
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=15)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(proc.returncode, -signal.SIGINT)  # dies of it, so a shell loop of runs stops
        self.assertEqual(processes_with(self.marker), [])

    def test_ctrl_z_stops_every_worker_and_ddl_and_fg_resumes_them_all(self):
        proc = start_ddl("-np", "2", "--", "sh", "-c", self.script)
        self.wait_for_workers(4)
        everything = processes_with(self.marker)  # ddl, its 2 shells and their 4 sleeps
        stopped = is_stopped
        proc.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
        self.assertTrue(wait_until(lambda: all(stopped(p) for p in everything), 10),
                        f"not all stopped: {[p for p in everything if not stopped(p)]} of {everything} (ddl {proc.pid})")
        time.sleep(0.3)
        self.assertTrue(all(stopped(p) for p in everything), "something went on running")
        proc.send_signal(signal.SIGCONT)  # fg
        self.assertTrue(wait_until(lambda: not any(stopped(p) for p in everything), 10),
                        f"still stopped after SIGCONT: {[p for p in everything if stopped(p)]}")
        self.assertEqual(sorted(processes_with(self.marker)), sorted(everything))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        self.assertEqual(proc.returncode, -signal.SIGINT, err)
        self.assertEqual(processes_with(self.marker), [])

    def test_ctrl_c_while_the_gpus_are_looked_for_starts_no_worker(self):
        # An nvidia-smi that takes 3 s to answer (a busy node's driver); Ctrl-C comes 1 s in.
        with tempfile.TemporaryDirectory() as tmp:
            write_executable(tmp, "nvidia-smi", "#!/bin/sh\nsleep 3\necho 0\necho 1\n")
            started = os.path.join(tmp, "started")
            env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.startswith(("SLURM_", "PBS_"))}
            env["PATH"] = f"{tmp}:{env.get('PATH', '/usr/bin:/bin')}"
            proc = subprocess.Popen([DDL, "run", "-np", "2", "--", "sh", "-c", f"touch {started}; {self.script}"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            time.sleep(1)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            self.assertEqual(proc.returncode, -signal.SIGINT, err)
            self.assertIn("ddl: interrupted by SIGINT; stopped 0 worker(s)", err)  # none started, none to stop
            self.assertFalse(os.path.exists(started), "a worker started after Ctrl-C")

    def test_every_signal_that_would_end_ddl_stops_the_workers_and_what_they_forked(self):
        # A signal ddl did not catch would end it at once, leaving what the workers forked behind.
        for sig in (signal.SIGQUIT, signal.SIGALRM, signal.SIGXCPU):
            with self.subTest(signal=sig.name):
                proc = start_ddl("-np", "2", "--", "sh", "-c", self.script)
                self.wait_for_workers(4)
                proc.send_signal(sig)
                out, err = proc.communicate(timeout=15)
                self.assertEqual(proc.returncode, 128 + sig, err)
                self.assertIn(f"ddl: interrupted by {sig.name}", err)
                self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 15), processes_with(self.marker))

    def test_a_stop_signal_ddl_was_started_ignoring_stays_ignored(self):
        # `nohup ddl run ...` (HUP) and `ddl run ... &` in a script (INT, QUIT): the run was to outlive
        # them, and ddl stopped it on them all the same.
        for sig in (signal.SIGHUP, signal.SIGINT):
            with self.subTest(signal=sig.name), tempfile.TemporaryDirectory() as tmp:
                started = os.path.join(tmp, "started")
                proc = subprocess.Popen([DDL, "run", "-np", "1", "--", "sh", "-c", f"touch {started}; sleep 3; echo finished"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                        preexec_fn=lambda s=sig: signal.signal(s, signal.SIG_IGN))
                self.assertTrue(wait_until(lambda: os.path.exists(started), 30), "the worker did not start")
                proc.send_signal(sig)
                out, err = proc.communicate(timeout=30)
                self.assertEqual((proc.returncode, out), (0, "[0] finished\n"), err)

    def test_a_stopped_worker_is_continued_so_it_acts_on_the_stop_at_once(self):
        # Rank 0 stops itself (as Ctrl-Z or a debugger would); rank 1 fails. A stopped process
        # cannot act on SIGTERM until continued: ddl sends SIGCONT after it, not the grace period's SIGKILL.
        script = f'if [ "$RANK" = 0 ]; then kill -STOP $$; sleep {self.marker}; fi; sleep 1; exit 3'
        start = time.monotonic()
        result = ddl("-np", "2", "--grace-period", "120", "--", "sh", "-c", script, timeout=100)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertLess(time.monotonic() - start, 60)  # far from the 120 s grace period
        self.assertEqual(processes_with(self.marker), [])

    def test_workers_die_with_a_killed_launcher(self):
        proc = start_ddl("-np", "2", "--", "sleep", self.marker)
        self.wait_for_workers(2)
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 30))

    def test_what_the_workers_forked_dies_with_a_killed_launcher_too(self):
        # `sh -c 'sleep; true'` forks its sleep: the shell dies with ddl (PR_SET_PDEATHSIG), the
        # sleep must not be left to init.
        proc = start_ddl("-np", "2", "--", "sh", "-c", self.script)
        self.wait_for_workers(4)
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 15), processes_with(self.marker))

    def test_after_a_killed_launcher_what_ignores_sigterm_gets_sigkill_after_the_grace_period(self):
        stubborn = f'trap "" TERM; sleep {self.marker}; true'  # the sleep inherits SIGTERM ignored
        proc = start_ddl("-np", "2", "--grace-period", "3", "--", "sh", "-c", stubborn)
        self.wait_for_workers(2)
        proc.kill()
        proc.communicate(timeout=15)
        time.sleep(0.5)
        self.assertEqual(len(sleeps_with(self.marker)), 2, "SIGKILL came before the grace period")
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 20), processes_with(self.marker))


    def test_after_a_killed_launcher_what_left_an_ended_worker_s_group_and_environment_is_stopped(self):
        # Rank 0 starts a process that leaves its group and clears its environment (env -i), then
        # ends: the process is still in rank 0's session, which the guard goes by.
        script = (f'if [ "$RANK" = 0 ]; then env -i /usr/bin/python3 -c "import os, time; os.setpgid(0, 0); time.sleep(600)" '
                  f'{self.marker} & sleep 0.5; exit 0; fi; sleep {self.marker}')
        proc = start_ddl("-np", "2", "--", "sh", "-c", script)
        self.assertTrue(wait_until(lambda: len(sleeps_with(self.marker)) == 1 and
                                   any(comm(pid) == "python3" for pid in processes_with(self.marker)), 30))
        time.sleep(1)  # rank 0 has ended by now
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 15), processes_with(self.marker))

    def test_after_a_killed_launcher_what_left_the_session_and_cleared_its_environment_is_stopped_by_its_cgroup(self):
        # setsid -f and env -u leave everything the guard finds by session and environment: only the
        # run's own cgroup still holds it. A system that gives ddl none (no cgroup v2, or no right
        # to make a child of its own cgroup) cannot stop such a process, and says so here.
        script = f"setsid -f env -u DDL_WORKER_GUARD sleep {self.marker}; sleep {self.marker}"
        proc = start_ddl("-np", "2", "--", "sh", "-c", script)
        self.wait_for_workers(4)
        cgroups = set()
        for pid in sleeps_with(self.marker):
            with open(f"/proc/{pid}/cgroup") as f:
                cgroups |= {line[3:].strip() for line in f if line.startswith("0::")}
        if not any(os.path.basename(c).startswith(f"ddl.{proc.pid}.") for c in cgroups):
            proc.kill()
            proc.communicate(timeout=15)
            kill_leftovers(self.marker)
            self.skipTest(f"SKIPPED LOUDLY: this system gives ddl no cgroup v2 of its own (the workers are in {cgroups})")
        self.assertEqual(len(cgroups), 1, cgroups)  # every sleep, the escaped ones too
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 15), processes_with(self.marker))
        mount = next(line.split()[4] for line in open("/proc/self/mountinfo") if " - cgroup2 " in line)
        self.assertTrue(wait_until(lambda: not os.path.exists(mount + next(iter(cgroups))), 10),
                        "the run's cgroup was not removed")

    def test_the_guard_is_not_found_by_pkill_ddl(self):
        # `pkill -9 ddl` or `pkill -9 -f "ddl run"` must leave the guard to clean up after ddl.
        proc = start_ddl("-np", "2", "--", "sh", "-c", self.script)
        self.wait_for_workers(4)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        guards = [pid for pid in children if open(f"/proc/{pid}/comm").read().strip() == "worker-guard"]
        self.assertEqual(len(guards), 1, children)
        self.assertEqual(open(f"/proc/{guards[0]}/cmdline", "rb").read().rstrip(b"\0"), b"worker-guard")
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: int(guards[0]) not in processes_with("worker-guard"), 15), "the guard did not end")

    def test_after_a_killed_launcher_what_left_the_workers_group_is_stopped_too(self):
        # coreutils `timeout` moves itself into a group of its own, its program with it.
        proc = start_ddl("-np", "2", "--", "sh", "-c", f"timeout 600 sleep {self.marker}")
        self.wait_for_workers(2)
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 15), processes_with(self.marker))


class KilledInsideALauncher(unittest.TestCase):
    """Each ddl of a bigger run (a rank's `ddl exec --relay` under mpirun, a `ddl run` inside a
    worker) has a guard of its own, which must stop what its own workers forked and nothing else."""

    def setUp(self):
        self.marker = unique_marker()
        self.addCleanup(kill_leftovers, self.marker)

    def test_a_rank_s_killed_ddl_exec_leaves_mpirun_and_the_other_ranks_to_mpirun(self):
        # Every rank of the run shares the store's token: a guard that went by it stopped mpirun too.
        proc = subprocess.Popen(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", DDL, "exec", "--relay", "--cpu",
                                 "--", "sh", "-c", f"sleep {self.marker}; true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, env={**os.environ, "DDL_STORE_TOKEN": "0123456789abcdef" * 2})
        self.assertTrue(wait_until(lambda: len(sleeps_with(self.marker)) == 2, 60), "the ranks did not start")
        relays = [pid for pid in processes_with(self.marker) if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[1:3] == [b"exec", b"--relay"]]
        self.assertEqual(len(relays), 2, relays)
        os.kill(relays[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 137, out)  # mpirun's own report of a rank killed by SIGKILL
        self.assertIn("exited on signal 9", out)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 20), processes_with(self.marker))

    def test_a_killed_ddl_run_s_inner_ddl_run_still_cleans_up_after_its_workers(self):
        # The inner run's worker ignores SIGTERM: the outer guard kills the inner ddl after its grace
        # period; the inner guard must still be there then to stop the worker's sleep.
        inner = f'trap "" TERM; sleep {self.marker} & wait'
        proc = start_ddl("-np", "1", "--grace-period", "1", "--", DDL, "run", "-np", "1", "--grace-period", "1", "--", "sh", "-c", inner)
        self.assertTrue(wait_until(lambda: len(sleeps_with(self.marker)) == 1, 30), "the inner run did not start")
        proc.kill()
        proc.communicate(timeout=15)
        self.assertTrue(wait_until(lambda: processes_with(self.marker) == [], 20), processes_with(self.marker))


def process_with_pid(pid, attempts=200):
    """Forks a process that gets `pid` (forced through ns_last_pid, as a busy node's pid wrap-around
    would give it) and leads its own session, as a daemon, a login shell or another run's worker
    does; returns its pid, or None when another process took the pid first every time."""
    for _ in range(attempts):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        if child.pid == pid:
            return child
        child.kill()
        child.wait()
    return None


@unittest.skipUnless(os.geteuid() == 0, "needs root to choose the next pid (/proc/sys/kernel/ns_last_pid)")
class ReusedPids(unittest.TestCase):
    """A worker that ended early leaves its pid free; on a busy node another process may get it,
    with a group and session of the same number. Neither ddl's clean-up at the end nor the guard
    after a `kill -9` of ddl may signal that group."""

    def setUp(self):
        self.marker = unique_marker()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(kill_leftovers, self.marker)
        # Rank 1 writes its pid and ends at once; rank 0 runs until told to end.
        script = (f'if [ "$RANK" = 1 ]; then echo $$ > {self.tmp}/rank1; exit 0; fi; '
                  f'while [ ! -e {self.tmp}/end ]; do sleep 0.05; done; sleep {self.marker} & wait')
        self.proc = start_ddl("-np", "2", "--grace-period", "1", "--", "sh", "-c", script)
        self.assertTrue(wait_until(lambda: os.path.exists(f"{self.tmp}/rank1") and os.path.getsize(f"{self.tmp}/rank1") > 0, 30))
        rank1 = int(open(f"{self.tmp}/rank1").read())
        self.assertTrue(wait_until(lambda: not os.path.exists(f"/proc/{rank1}"), 30), "rank 1 was not reaped")
        self.victim = process_with_pid(rank1)
        if self.victim is None:
            self.proc.kill()
            self.skipTest(f"pid {rank1} could not be had again")
        self.addCleanup(self.victim.wait)
        self.addCleanup(self.victim.kill)

    def assert_victim_lives(self):
        time.sleep(1.5)  # past the 1 s grace period: a SIGKILL would have come
        self.assertIsNone(self.victim.poll(), f"the unrelated process got signal {-(self.victim.returncode or 0)}")

    def test_a_normal_end_leaves_another_process_with_an_ended_worker_s_pid_alone(self):
        open(f"{self.tmp}/end", "w").close()
        self.assertTrue(wait_until(lambda: sleeps_with(self.marker) != [], 30))
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)
        self.assert_victim_lives()

    def test_the_guard_leaves_another_process_with_an_ended_worker_s_pid_alone(self):
        self.proc.kill()
        self.proc.communicate(timeout=30)
        self.assert_victim_lives()


class PassedOnSignals(unittest.TestCase):
    def test_sigusr1_reaches_every_worker_and_the_run_goes_on(self):
        # Slurm's --signal=B:USR1@300 asks for a checkpoint before the time limit; it must not kill ddl.
        marker = unique_marker()
        self.addCleanup(kill_leftovers, marker)
        script = ('trap \'echo "rank $RANK checkpoint"; exit 0\' USR1; echo ready; '
                  f'sleep {marker} & wait; sleep {marker} & wait')
        proc = start_ddl("-np", "2", "--", "sh", "-c", script)
        self.assertTrue(wait_until(lambda: len(sleeps_with(marker)) >= 2, 30))
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0, out + err)
        self.assertIn("[0] rank 0 checkpoint", out)
        self.assertIn("[1] rank 1 checkpoint", out)


# Rank 1 fails (code 10 + its restart count) until restart FAIL_UNTIL; every worker says what it got.
# Rank 1 fails only once rank 0 has spoken in the same start (a file per restart count in $SAID;
# bounded at 30 s), since the failure stops rank 0: on a loaded machine a shell can take longer to
# start than rank 1 to fail.
FLAKY = ('echo "rank $RANK restart $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS run $TORCHELASTIC_RUN_ID '
         'store $DDL_STORE_ADDR $(echo $DDL_STORE_TOKEN | cksum)"; '
         'touch "$SAID/said.$RANK.$TORCHELASTIC_RESTART_COUNT"; '
         'if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt "$FAIL_UNTIL" ]; then '
         'i=0; while [ ! -e "$SAID/said.0.$TORCHELASTIC_RESTART_COUNT" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; '
         'exit $((10 + TORCHELASTIC_RESTART_COUNT)); fi; '
         'sleep 0.2')


class Restarts(unittest.TestCase):
    def flaky(self, *ddl_args, fail_until):
        """`ddl run -np 2 DDL_ARGS -- sh -c FLAKY` with FAIL_UNTIL and a fresh $SAID folder."""
        with tempfile.TemporaryDirectory() as said:
            return ddl("-np", "2", *ddl_args, "--", "sh", "-c", FLAKY, env={"FAIL_UNTIL": str(fail_until), "SAID": said},
                       timeout=60)

    def said(self, stdout):
        """[(rank, restart, run id, store, token checksum)] in output order."""
        found = []
        for line in stdout.splitlines():
            words = line.split()
            if len(words) >= 9 and words[1] == "rank":
                restart, most = words[4].split("/")
                found.append((int(words[2]), int(restart), int(most), words[6], words[8], words[9]))
        return found

    def test_a_failed_group_is_started_again_with_the_next_restart_count_and_a_fresh_store(self):
        result = self.flaky("--max-restarts", "3", fail_until=2)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        said = self.said(result.stdout)
        self.assertEqual(sorted((rank, restart) for rank, restart, *_ in said), [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)])
        self.assertTrue(all(most == 3 for _, _, most, *_ in said))
        self.assertEqual(len({run_id for *_, run_id, _, _ in said}), 1)  # one run, as torchrun's run id
        stores = {restart: (store, token) for _, restart, _, _, store, token in said}
        self.assertEqual(len(set(stores.values())), 3, stores)  # a new store and token for each start
        self.assertIn("ddl: rank 1 on ", result.stderr)
        self.assertIn("exited with code 10; restarting all workers (1 of 3 restarts)", result.stderr)
        self.assertIn("exited with code 11; restarting all workers (2 of 3 restarts)", result.stderr)
        self.assertNotIn("ddl: error", result.stderr)

    def test_out_of_restarts_ddl_exits_with_the_last_failure_s_code(self):
        result = self.flaky("--max-restarts", "2", fail_until=99)
        self.assertEqual(result.returncode, 12, result.stdout + result.stderr)
        self.assertEqual(sorted({restart for _, restart, *_ in self.said(result.stdout)}), [0, 1, 2])
        self.assertIn("ddl: error: rank 1 on ", result.stderr)
        self.assertIn("exited with code 12", result.stderr)

    def test_without_max_restarts_a_failure_ends_the_run(self):
        result = self.flaky(fail_until=1)
        self.assertEqual(result.returncode, 10, result.stdout + result.stderr)
        self.assertNotIn("restarting", result.stderr)

    def test_ctrl_c_is_not_a_failure_to_restart_from(self):
        marker = unique_marker()
        self.addCleanup(kill_leftovers, marker)
        proc = start_ddl("-np", "2", "--max-restarts", "5", "--", "sleep", marker)
        self.assertTrue(wait_until(lambda: len(processes_with(marker)) >= 3, 30))
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, -signal.SIGINT, err)
        self.assertNotIn("restarting", err)
        self.assertTrue(wait_until(lambda: processes_with(marker) == [], 30))

    def test_ctrl_c_while_a_failed_attempt_stops_its_workers_is_no_restart_either(self):
        # Rank 0 fails; rank 1 ignores SIGTERM, so the attempt is still stopping (--grace-period)
        # when Ctrl-C comes: it ends the run with the failure's code, and nothing starts again.
        marker = unique_marker()
        self.addCleanup(kill_leftovers, marker)
        with tempfile.TemporaryDirectory() as tmp:
            failed, ready = os.path.join(tmp, "failed"), os.path.join(tmp, "ready")
            # Rank 0 fails only once rank 1 ignores SIGTERM (bounded at 30 s): on a loaded machine
            # rank 1's shell can start after rank 0 failed, and SIGTERM would end it at once.
            script = (f'if [ "$RANK" = 0 ]; then i=0; while [ ! -e {ready} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; '
                      f'touch {failed}; exit 3; fi; '
                      f'trap "" TERM; touch {ready}; sleep {marker} & wait; sleep {marker}')
            proc = start_ddl("-np", "2", "--max-restarts", "3", "--grace-period", "30", "--", "sh", "-c", script)
            self.assertTrue(wait_until(lambda: os.path.exists(failed), 30))
            time.sleep(1)  # ddl has seen the failure and sent SIGTERM, which rank 1 ignores
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 3, err)
        self.assertNotIn("restarting", err)
        self.assertTrue(wait_until(lambda: processes_with(marker) == [], 30))

    def test_a_restart_s_output_dir_files_go_on_after_the_failed_attempt_s(self):
        with tempfile.TemporaryDirectory() as out_dir:
            result = self.flaky("--max-restarts", "3", "--output-dir", out_dir, fail_until=1)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(os.path.join(out_dir, "rank.1.out")) as f:
                lines = f.read().splitlines()
        self.assertEqual([line.split()[3] for line in lines], ["0/3", "1/3"], lines)  # both attempts' words

    def test_a_failed_attempt_s_unfinished_last_line_does_not_run_into_the_next_start_s_first(self):
        with tempfile.TemporaryDirectory() as out_dir, tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "failed-once")
            script = (f'if [ ! -e {marker} ]; then touch {marker}; printf "last words" >&2; exit 7; fi; '
                      'echo "started again" >&2')
            result = ddl("-np", "1", "--max-restarts", "1", "--output-dir", out_dir, "--", "sh", "-c", script, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(out_dir, "rank.0.err")) as f:
                self.assertEqual(f.read(), "last words\nstarted again\n")

    def test_max_restarts_must_be_a_count(self):
        result = ddl("-np", "2", "--max-restarts", "-1", "--", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--max-restarts", result.stderr)


if __name__ == "__main__":
    unittest.main()


class RelayingExec(unittest.TestCase):
    """`ddl exec --relay`, as a task launcher starts it under `ddl run` in an allocation (here with
    MPICH-style PMI variables, as mpiexec sets them): the worker's output as relayed lines, and
    ddl exec ending exactly as its worker did."""

    def start(self, script):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "DDL_", "OMPI_", "PMI"))}
        env.update({"PMI_RANK": "3", "PMI_SIZE": "4"})
        return subprocess.Popen([DDL, "exec", "--relay", "--cpu", "--", "python3", "-c", script], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def test_every_piece_goes_as_a_line_marked_by_how_its_line_ended(self):
        # One write after the pause, so that the redraws' '\r' is never the last byte of a read.
        script = ("import sys, time\n"
                  "sys.stdout.write('Loading...'); sys.stdout.flush(); time.sleep(1)\n"
                  "sys.stdout.write(' done\\n10%\\r20%\\rend\\n'); sys.stdout.flush()\n"
                  "print('oops', file=sys.stderr)\n")
        out, err = self.start(script).communicate(timeout=30)
        # Each stream first names the host the rank runs on (for ddl run --prefix host).
        host = socket.gethostname().encode()
        self.assertEqual(out, b"3@ " + host + b"\n3+ Loading...\n3:  done\n3~ 10%\n3~ 20%\n3: end\n")
        self.assertEqual(err, b"3@ " + host + b"\n3: oops\n")

    def test_it_ends_with_the_worker_s_code_or_by_its_signal(self):
        for script, code in (("import sys; sys.exit(5)", 5), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL)):
            proc = self.start(script)
            proc.communicate(timeout=30)
            self.assertEqual(proc.returncode, code, script)
        # A SIGTERM goes on to the worker, which ends in its own way; ddl exec then ends with 0 (so
        # that srun's --kill-on-bad-exit leaves the other tasks their grace) and relays how it ended.
        proc = self.start("import signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))\n"
                          "print('ready', flush=True)\n"
                          "time.sleep(60)\n")
        self.assertEqual(proc.stdout.readline(), b"3@ " + socket.gethostname().encode() + b"\n")
        self.assertEqual(proc.stdout.readline(), b"3: ready\n")
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(out, b"3= 768\n")  # exit code 3, as waitpid() gives it
