"""Requeue at the time limit on a real Slurm (scripts/local_slurm.sh: slurmctld + slurmd + munge on
loopback): `ddl submit --requeue` writes --signal=B:USR1@S, --requeue and --open-mode=append, and
`ddl run --requeue-signal USR1` on the script's last line passes the signal to the workers, waits for
them to save and end, then requeues the job (scontrol requeue) while --max-requeues allows.

Slurm holds a requeued job for about two minutes (its BeginTime) before it may start again; as the
cluster's administrator the tests end that hold at once (scontrol update StartTime=now), and Slurm
then starts the job as it would have two minutes later. Everything else is Slurm's own doing: the
time limit, the signal before it, the restart count."""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from ddl_testing import (DDL, PYTHON, SOURCE, kill_leftovers, processes_with, read_text, slurm_env, start_local_slurm, unique_marker,
                         wait_until, write_executable)

WORKER = os.path.join(SOURCE, "tests", "integration", "requeue_worker.py")
LIGHTNING_FIT = os.path.join(SOURCE, "tests", "integration", "lightning_requeue.py")
LIGHTNING_PYTHON = os.environ.get("DDL_LIGHTNING_PYTHON") or "/var/cache/ddl/lightning-venv/bin/python"


def run(argv, timeout=60, **kwargs):
    return subprocess.run(argv, env=kwargs.pop("env", slurm_env()), capture_output=True, text=True, timeout=timeout, **kwargs)


def job_fields(job):
    """scontrol show job's Name=value pairs; {} once Slurm forgets the job."""
    shown = run(["scontrol", "show", "job", job]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


class Requeue(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start_local_slurm()

    def setUp(self):
        self.marker = unique_marker()
        self.addCleanup(kill_leftovers, self.marker)

    def test_requeue_signal_in_an_interactive_allocation_is_refused_before_anything_runs(self):
        # scontrol requeue refuses salloc's jobs: said at the start, not at the time limit.
        result = run(["salloc", "-N1", "-n1", DDL, "run", "--cpu", "--requeue-signal", "USR1", "--", "echo", "ran"])
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertRegex(result.stderr, r"ddl: error: --requeue-signal requeues a Slurm batch job, and job \d+ is an interactive "
                                        r"allocation \(salloc\)")
        self.assertNotIn("ran", result.stdout)

    def cancel_at_end(self, job):
        self.addCleanup(run, ["scancel", job])

    def follow(self, job, output, until, timeout):
        """Waits for `until(output text, job fields)`, ending each requeued start's hold at once."""
        deadline = time.monotonic() + timeout
        held_since = None
        while time.monotonic() < deadline:
            fields = job_fields(job)
            held = fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime"
            held_since = (held_since or time.monotonic()) if held else None
            if held and self.hold_may_end(job, held_since):
                run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            text = read_text(output)
            if until(text, fields):
                return text, fields
            time.sleep(0.5)
        self.fail(f"job {job} did not get there in {timeout} s; its output:\n{text}\n{fields}")

    @staticmethod
    def hold_may_end(job, held_since):
        """Whether the requeued job's last start is over: its step daemons gone, the node idle, and 3 s
        past (slurmd refuses a job's new credential within the second it revoked the old one: "Job
        credential revoked"). The two-minute hold is there for this."""
        return (time.monotonic() - held_since >= 3 and not processes_with(f"slurmstepd: [{job}.")
                and run(["sinfo", "-h", "-o", "%T"]).stdout.split() == ["idle"])

    def submit_requeueable(self, script, output, cwd):
        """sbatch of `script` as `ddl submit --requeue` would write it; the job's id."""
        submitted = run(["sbatch", "-N1", "-n2", "--requeue", "--open-mode=append", "-o", output], input=script, cwd=cwd)
        self.assertEqual(submitted.returncode, 0, submitted.stderr)
        job = re.search(r"Submitted batch job (\d+)", submitted.stdout).group(1)
        self.cancel_at_end(job)
        return job

    def signal_batch_shell(self, job):
        """What --signal=B:USR1@S does before the time limit, done now: USR1 to the batch shell (ddl run) alone."""
        signalled = run(["scancel", "--batch", "--signal=USR1", job])
        self.assertEqual(signalled.returncode, 0, signalled.stderr)

    def test_a_job_past_its_time_limit_twice_resumes_and_finishes_on_its_third_start(self):
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        submitted = run([DDL, "submit", "--site", "slurm", "--gpus-per-node", "2", "-t", "1", "--requeue", "--signal-before", "50",
                         "--max-requeues", "2", "--", PYTHON, WORKER, tmp, "save", "2", self.marker], cwd=tmp)
        self.assertEqual(submitted.returncode, 0, submitted.stdout + submitted.stderr)
        job = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
        self.cancel_at_end(job)
        output = os.path.join(tmp, f"ddl-{job}.out")
        ended = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
        text, fields = self.follow(job, output, lambda text, fields: fields.get("JobState") in ended, 300)
        self.assertEqual((fields["JobState"], fields["ExitCode"], fields["Restarts"]), ("COMPLETED", "0:0", "2"), text)
        for rank in (0, 1):
            starts = re.findall(rf"\[{rank}\] start rank={rank} requeues=(\d) slurm=(\S+) step=(\d+)", text)
            saves = re.findall(rf"\[{rank}\] saved rank={rank} step=(\d+)", text)
            self.assertEqual([(r, s) for r, s, _ in starts], [("0", "-"), ("1", "1"), ("2", "2")], text)
            self.assertEqual(len(saves), 2, text)
            # Each start goes on from the step the one before saved at its signal.
            self.assertEqual([int(step) for _, _, step in starts], [0, int(saves[0]), int(saves[1])], text)
            self.assertGreater(int(saves[1]), int(saves[0]), text)
            self.assertIn(f"[{rank}] done rank={rank} step={int(saves[1]) + 10}", text)
        # The output of the three starts is one file (--open-mode=append), with ddl's word on each requeue.
        self.assertEqual(re.findall(rf"ddl: requeueing job {job} \(requeue (\d) of 2\)", text), ["1", "2"], text)

    def test_workers_that_ignore_the_signal_are_stopped_after_their_grace_and_the_last_requeue_allowed_is_the_last(self):
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        output = os.path.join(tmp, "job.out")
        script = (f"#!/bin/bash\nexec {DDL} run --cpu --requeue-signal USR1 --requeue-grace 2 --max-requeues 1 -- "
                  f"{PYTHON} {WORKER} {tmp} ignore 0 {self.marker}\n")
        job = self.submit_requeueable(script, output, tmp)
        for start in (1, 2):
            self.follow(job, output, lambda text, fields: text.count("start rank=") == 2 * start, 120)
            self.signal_batch_shell(job)
            self.follow(job, output, lambda text, fields: text.count("stopping them") == start, 60)
        text, fields = self.follow(job, output, lambda text, fields: fields.get("JobState") in ("COMPLETED", "FAILED"), 60)
        self.assertTrue(wait_until(lambda: not processes_with(self.marker), 30), "a worker outlived the job")
        self.assertEqual(text.count("ddl: workers still running 2 s after SIGUSR1 (their time to save and end): stopping them"), 2, text)
        self.assertEqual(re.findall(r"requeues=(\d)", text), ["0", "0", "1", "1"], text)
        self.assertIn(f"ddl: requeueing job {job} (requeue 1 of 1)", text)
        self.assertIn(f"ddl: job {job} is not requeued: it has been requeued 1 time(s), as many as --max-requeues 1 allows", text)
        self.assertIn("ddl: error: the run ended on SIGUSR1 (--requeue-signal) and the job was not requeued; workers that did not end in "
                      "time were stopped", text)
        self.assertEqual((fields["JobState"], fields["ExitCode"], fields["Restarts"]), ("FAILED", "138:0", "1"), text)

    def signalled_once(self, tmp, ddl_run_words, end_within):
        """The output of a job `ddl run --cpu --requeue-signal USR1 --max-requeues 0 DDL_RUN_WORDS`
        (two workers, each printing "start rank=") whose batch shell gets USR1 once both started."""
        output = os.path.join(tmp, "job.out")
        script = f"#!/bin/bash\nexec {DDL} run --cpu --requeue-signal USR1 --max-requeues 0 {ddl_run_words}\n"
        job = self.submit_requeueable(script, output, tmp)
        self.follow(job, output, lambda text, fields: text.count("start rank=") == 2, 120)
        self.signal_batch_shell(job)
        text, _ = self.follow(job, output, lambda text, fields: fields.get("JobState") in ("COMPLETED", "FAILED"), end_within)
        return text

    def test_workers_ddl_starts_itself_get_the_signal_and_save(self):
        # With --launcher local ddl starts the workers, not srun: they inherited the signal blocked
        # (ddl holds it for the whole run), so no handler ran and they were stopped after the grace.
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        text = self.signalled_once(tmp, f"--launcher local -np 2 --requeue-grace 20 -- {PYTHON} {WORKER} {tmp} save 0 {self.marker}", 60)
        for rank in (0, 1):
            self.assertRegex(text, rf"\[{rank}\] saved rank={rank} step=\d+", text)
        self.assertNotIn("stopping them", text)

    def test_under_srun_a_rank_that_dies_of_the_signal_leaves_the_others_saving(self):
        # Rank 0 has no handler and dies of USR1 at once; rank 1 saves for 3 s. srun (with
        # --kill-on-bad-exit, ddl's fail-fast) killed rank 1 mid-save.
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as f:
            f.write("import os, signal, sys, time\n"
                    "def save(*_):\n    time.sleep(3)\n    print('saved', flush=True)\n    sys.exit(0)\n"
                    "if os.environ['RANK'] == '1':\n    signal.signal(signal.SIGUSR1, save)\n"
                    "print('start rank=' + os.environ['RANK'], flush=True)\n"
                    f"time.sleep(600)  # {self.marker}\n")
        text = self.signalled_once(tmp, f"-np 2 --requeue-grace 30 -- {PYTHON} {worker}", 90)
        self.assertIn("[1] saved", text)
        self.assertNotIn("stopping them", text)

    def fake_slurm_job(self, squeue_takes=0):
        """The environment of a batch job 4242 whose squeue (answering after `squeue_takes` s: 1:40
        left) and scontrol are stand-ins, for what the real Slurm cannot be made to do on time."""
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        write_executable(tmp, "squeue", f"#!/bin/sh\nsleep {squeue_takes}\necho 1:40\n")
        write_executable(tmp, "scontrol", "#!/bin/sh\nexit 0\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        return {**env, "PATH": f"{tmp}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}

    def test_the_hang_watchdog_leaves_workers_saving_after_the_signal_alone(self):
        saver = ("import signal, sys, time\n"
                 "def save(*_):\n    time.sleep(4)\n    print('saved', flush=True)\n    sys.exit(0)\n"
                 "signal.signal(signal.SIGUSR1, save)\nprint('up', flush=True)\ntime.sleep(600)  # " + self.marker + "\n")
        ddl = subprocess.Popen([DDL, "run", "--cpu", "-np", "1", "--launcher", "local", "--requeue-signal", "USR1", "--requeue-grace", "20",
                                "--max-requeues", "1", "--hang-timeout", "2", "--", PYTHON, "-c", saver],
                               env=self.fake_slurm_job(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(ddl.kill)
        self.assertEqual(ddl.stdout.readline(), "[0] up\n")
        ddl.send_signal(signal.SIGUSR1)
        out, err = ddl.communicate(timeout=60)
        self.assertIn("[0] saved", out, err)  # 4 quiet seconds of saving were a hang of 2
        self.assertNotIn("hung", err)
        self.assertEqual(ddl.returncode, 0, err)

    def test_workers_that_end_while_squeue_answers_are_seen_ending(self):
        # ddl asks squeue for the time left as the signal comes; workers that die of it meanwhile
        # (a program without a handler) sent a SIGCHLD that the squeue call dropped: ddl waited for
        # them for ever. A slow squeue (a busy controller) and a fake scontrol stand in for Slurm's.
        env = self.fake_slurm_job(squeue_takes=1)
        ddl = subprocess.Popen([DDL, "run", "--cpu", "-np", "2", "--launcher", "local", "--requeue-signal", "USR1", "--max-requeues", "1",
                                "--", PYTHON, "-c", f"import time; print('up', flush=True); time.sleep(600)  # {self.marker}"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(ddl.kill)
        self.assertEqual(sorted([ddl.stdout.readline(), ddl.stdout.readline()]), ["[0] up\n", "[1] up\n"])  # in either order
        ddl.send_signal(signal.SIGUSR1)
        try:
            out, err = ddl.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("ddl run waited on for workers that had died of the signal")
        self.assertIn("ddl: requeueing job 4242 (requeue 1 of 1)", err)
        self.assertEqual(ddl.returncode, 0, err)

    def test_a_lightning_fit_goes_on_from_its_last_checkpoint_after_the_requeue(self):
        if not os.access(LIGHTNING_PYTHON, os.X_OK):
            self.fail(f"no Lightning venv: {LIGHTNING_PYTHON} is missing; run `bash scripts/lightning_venv.sh`")
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        output = os.path.join(tmp, "job.out")
        script = (f"#!/bin/bash\nexec {DDL} run --cpu --requeue-signal USR1 --max-requeues 1 -- "
                  f"{LIGHTNING_PYTHON} {LIGHTNING_FIT} {tmp}/checkpoints {self.marker}\n")
        job = self.submit_requeueable(script, output, tmp)
        self.follow(job, output, lambda text, fields: "lightning step rank=0 step=10" in text, 180)
        self.signal_batch_shell(job)
        text, fields = self.follow(job, output, lambda text, fields: fields.get("JobState") in ("COMPLETED", "FAILED"), 240)
        self.assertTrue(wait_until(lambda: not processes_with(self.marker), 30), "a worker outlived the job")
        self.assertEqual((fields["JobState"], fields["ExitCode"], fields["Restarts"]), ("COMPLETED", "0:0", "1"), text)
        first, second = text.split(f"ddl: requeueing job {job} (requeue 1 of 1)")
        weights = set()
        for rank in (0, 1):
            self.assertIn(f"lightning start rank={rank} requeues=0 step=0", first)
            saved = int(re.findall(rf"lightning step rank={rank} step=(\d+)", first)[-1])  # the last checkpoint it reached
            resumed = int(re.search(rf"lightning start rank={rank} requeues=1 step=(\d+)", second).group(1))
            self.assertGreaterEqual(resumed, saved, text)  # (a later checkpoint may have been written before its print)
            self.assertGreaterEqual(resumed, 10, text)
            done = re.search(rf"lightning done rank={rank} requeues=1 step=(\d+) weights=(\w+)", second)
            self.assertEqual(int(done.group(1)), resumed + 20, text)
            weights.add(done.group(2))
        self.assertEqual(len(weights), 1, text)  # DDP's replicas, identical after the resumed fit

class RequeueFlags(unittest.TestCase):
    """Bad use is one line naming the flag, before anything starts."""

    def check_refused(self, argv, expected, env=None):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertIn(expected, result.stderr)

    def test_requeue_flags_are_checked(self):
        outside = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.check_refused([DDL, "run", "-np", "1", "--requeue-signal", "USR1", "--", "true"],
                           "--requeue-signal requeues a Slurm batch job, and this is not one (SLURM_JOB_ID is unset)", outside)
        self.check_refused([DDL, "run", "-np", "1", "--requeue-signal", "KILL", "--", "true"], "--requeue-signal 'KILL': only USR1 or USR2 can be used here")
        # srun kills every task on TERM or HUP: no worker could save.
        self.check_refused([DDL, "run", "-np", "1", "--requeue-signal", "TERM", "--", "true"], "--requeue-signal 'TERM': only USR1 or USR2 can be used here")
        self.check_refused([DDL, "run", "-np", "1", "--requeue-signal", "", "--", "true"], "--requeue-signal must not be empty")
        self.check_refused([DDL, "submit", "--site", "pbs", "--requeue", "--signal", "USR2", "--dry-run", "--", "true"],
                           "--signal: site 'pbs' uses PBS, which sends no signal before the walltime")
        self.check_refused([DDL, "run", "-np", "1", "--max-requeues", "3", "--", "true"], "--max-requeues is for --requeue-signal")
        self.check_refused([DDL, "run", "-np", "1", "--requeue-grace", "3", "--", "true"], "--requeue-grace is for --requeue-signal")
        self.check_refused([DDL, "submit", "--site", "slurm", "--signal", "USR2", "--dry-run", "--", "true"],
                           "--signal is for --signal-before or --requeue")
        self.check_refused([DDL, "submit", "--site", "slurm", "--max-requeues", "2", "--dry-run", "--", "true"],
                           "--max-requeues is for --requeue")
        self.check_refused([DDL, "submit", "--site", "slurm", "--requeue", "--signal", "STOP", "--dry-run", "--", "true"],
                           "--signal 'STOP': only USR1 or USR2 can be used here")
        self.check_refused([DDL, "submit", "--site", "pbs", "--requeue", "--max-requeues", "1", "--dry-run", "--", "true"],
                           "--max-requeues: site 'pbs' uses PBS")


if __name__ == "__main__":
    unittest.main()
