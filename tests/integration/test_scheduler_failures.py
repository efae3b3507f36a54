"""How `ddl submit`, `ddl status` and friends meet a scheduler whose tools fail or answer oddly.

A healthy local Slurm (test_slurm.py) never fails this way on cue, and this machine has no PBS: these
tests put stand-ins for sbatch, squeue and qstat first on PATH, each playing one documented failure
(squeue timing out on its controller, Slurm forgetting an ended job, OpenPBS's unescaped JSON), and
run the real `ddl` against them."""
import os
import subprocess
import tempfile
import textwrap
import unittest

from ddl_testing import DDL, write_executable


class SchedulerFailures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = os.path.join(self.tmp.name, "bin")
        os.mkdir(self.bin)
        state = os.path.join(self.tmp.name, "state")
        self.env = {**os.environ, "PATH": f"{self.bin}:/usr/bin:/bin", "XDG_STATE_HOME": state,
                    "XDG_CONFIG_HOME": os.path.join(self.tmp.name, "config"), "STATE": self.tmp.name}

    def tearDown(self):
        self.tmp.cleanup()

    def tool(self, name, script):
        write_executable(self.bin, name, "#!/bin/sh\n" + textwrap.dedent(script))

    def ddl(self, *args):
        return subprocess.run([DDL, *args], env=self.env, cwd=self.tmp.name, capture_output=True, text=True, timeout=60)

    def test_a_submitted_job_is_named_even_when_asking_about_it_fails(self):
        self.tool("sbatch", "cat > /dev/null; echo 4242\n")
        self.tool("squeue", "echo 'squeue: error: slurm_receive_msg: Socket timed out on send/recv operation' >&2; exit 1\n")
        result = self.ddl("submit", "--site", "slurm", "--", "python", "train.py")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("submitted job 4242 to Slurm (site slurm); output: ddl-4242.out", result.stdout)
        self.assertIn("ddl: warning: job 4242 was submitted, but asking about it failed: squeue failed", result.stderr)

    def test_a_job_slurm_stops_listing_before_it_ends_is_said_so_not_blamed_on_wait_timeout(self):
        self.tool("sbatch", "cat > /dev/null; echo 4242\n")
        # Listed as running twice, then forgotten (Slurm's MinJobAge passed): prints nothing.
        self.tool("squeue", """\
            n=$(cat "$STATE/polls" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/polls"
            case "$*" in *STDOUT*) [ "$n" -lt 3 ] && echo "$STATE/ddl-4242.out"; exit 0;; esac
            [ "$n" -lt 3 ] && echo "4242|RUNNING|None|node1|0:0|root|node1|4242|N/A|"
            exit 0
            """)
        result = self.ddl("submit", "--site", "slurm", "--wait", "--", "true")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("ddl: error: Slurm stopped listing job 4242 before ddl saw it end: how it ended is unknown here",
                      result.stderr)
        self.assertNotIn("--wait-timeout", result.stderr)

    def test_qstat_json_that_does_not_parse_is_an_error_not_an_empty_queue(self):
        # OpenPBS leaves a quote in a job variable unescaped (openpbs#2541): the document is not JSON.
        self.tool("qsub", "exit 1\n")
        self.tool("qstat", r"""echo "{\"Jobs\": {\"77.pbs01\": {\"Job_Name\": \"x\", \"Variable_List\": {\"MYVAR\": \"it\\'s\"}}}}"
            """)
        self.env["PATH"] = self.bin  # PBS's tools only: no sbatch
        result = self.ddl("status")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertNotIn("no jobs", result.stdout)
        self.assertIn("ddl: error: qstat -F json printed what is not qstat's JSON", result.stderr)

    def test_pbs_status_lists_the_users_jobs_without_qstat_u_which_openpbs_refuses_beside_json(self):
        # OpenPBS's qstat: -u with -f or -F is "qstat: conflicting options." (src/cmds/qstat.c), exit 2.
        self.tool("qsub", "exit 1\n")
        self.tool("qstat", r"""for a in "$@"; do [ "$a" = -u ] && { echo 'qstat: conflicting options.' >&2; exit 2; }; done
            echo '{"Jobs": {"7.pbs01": {"Job_Name": "mine", "Job_Owner": "alice@login1", "job_state": "R"},'
            echo '          "8.pbs01": {"Job_Name": "theirs", "Job_Owner": "bob@login1", "job_state": "Q"}}}'
            """)
        self.env["PATH"] = self.bin  # PBS's tools only: no sbatch
        self.env["USER"] = "alice"
        result = self.ddl("status")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("7.pbs01", result.stdout)
        self.assertNotIn("8.pbs01", result.stdout)

    def test_words_after_dashes_of_a_command_that_takes_no_program_are_refused(self):
        for args in (("status", "--", "4242"), ("cancel", "--", "4242"), ("sites", "--", "junk")):
            with self.subTest(args=args):
                result = self.ddl(*args)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertIn(f"ddl: error: ddl {args[0]} takes nothing after --, but was given '{args[2]}'", result.stderr)

    def test_wait_timeout_without_wait_and_empty_array_or_signal_are_refused(self):
        for args in (("--wait-timeout", "5"), ("--array", ""), ("--requeue", "--signal", "")):
            with self.subTest(args=args):
                result = self.ddl("submit", "--site", "slurm", "--dry-run", *args, "--", "true")
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertEqual(len(result.stderr.splitlines()), 2, result.stderr)  # the error and its hint


if __name__ == "__main__":
    unittest.main()
