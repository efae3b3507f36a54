"""`ddl run` gives every worker the environment of DESIGN.md section 4, with its own rank's values."""
import json
import os
import shutil
import socket
import tempfile
import unittest

from ddl_testing import PYTHON, ddl, ddl_raw, lines_by_rank, write_executable

CONTRACT = [
    "DDL_RANK", "DDL_SIZE", "DDL_LOCAL_RANK", "DDL_LOCAL_SIZE", "DDL_NODE_RANK", "DDL_NUM_NODES",
    "DDL_STORE_ADDR", "DDL_STORE_TOKEN", "DDL_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
]
PRINT_ENV = f"import os, json; print(json.dumps({{k: os.environ.get(k) for k in {CONTRACT!r}}}))"


def environments(*args, env=None):
    result = ddl(*args, "--", PYTHON, "-c", PRINT_ENV, env=env)
    assert result.returncode == 0, result.stderr
    return {rank: json.loads(lines[0]) for rank, lines in lines_by_rank(result.stdout).items()}


class WorkerEnvironment(unittest.TestCase):
    def test_every_rank_gets_its_own_values_and_the_shared_ones_agree(self):
        envs = environments("-np", "4", env={"CUDA_VISIBLE_DEVICES": ""})
        self.assertEqual(sorted(envs), [0, 1, 2, 3])
        for rank, e in envs.items():
            for name in ("DDL_RANK", "RANK", "ROLE_RANK", "DDL_LOCAL_RANK", "LOCAL_RANK"):
                self.assertEqual(e[name], str(rank), name)
            for name in ("DDL_SIZE", "WORLD_SIZE", "ROLE_WORLD_SIZE", "DDL_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
                self.assertEqual(e[name], "4", name)
            for name in ("DDL_NODE_RANK", "GROUP_RANK"):
                self.assertEqual(e[name], "0", name)
            for name in ("DDL_NUM_NODES", "GROUP_WORLD_SIZE"):
                self.assertEqual(e[name], "1", name)
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertRegex(e["DDL_STORE_TOKEN"], r"^[0-9a-f]{32}$")
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], e["DDL_RUN_ID"])
            self.assertEqual(e["CUDA_VISIBLE_DEVICES"], "")  # CPU workers: inherited value untouched
        for shared in ("MASTER_PORT", "DDL_STORE_ADDR", "DDL_STORE_TOKEN", "DDL_RUN_ID"):
            self.assertEqual(len({e[shared] for e in envs.values()}), 1, shared)
        port = int(envs[0]["MASTER_PORT"])
        self.assertTrue(1024 <= port <= 65535)
        self.assertRegex(envs[0]["DDL_STORE_ADDR"], r"^127\.0\.0\.1:\d+$")

    def test_an_enclosing_torchruns_agent_only_variables_are_not_passed_on(self):
        # Kept, TORCHELASTIC_USE_AGENT_STORE made torch's env:// init wait for an agent's store.
        agent = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
                 "TORCHELASTIC_TIMER_FILE": "/tmp/outer-timer", "TORCHELASTIC_ERROR_FILE": "/tmp/outer-error.json"}
        show = f"import os; print(sorted(k for k in {sorted(agent)!r} if k in os.environ))"
        result = ddl("-np", "2", "--", PYTHON, "-c", show, env=agent)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual({rank: lines[0] for rank, lines in lines_by_rank(result.stdout).items()}, {0: "[]", 1: "[]"})

    def test_a_worker_holds_dev_null_as_its_stdin_only(self):
        # ddl gives the worker /dev/null as stdin; the descriptor it opened for that stayed open too.
        show = ("import os\nfor f in os.listdir('/proc/self/fd'):\n"
                "    try: print(f, os.readlink('/proc/self/fd/' + f))\n    except OSError: pass")
        result = ddl("-np", "1", "--", PYTHON, "-c", show)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([line for line in lines_by_rank(result.stdout)[0] if line.endswith(" /dev/null")], ["0 /dev/null"],
                         result.stdout)

    def test_omp_threads_are_cores_per_worker_unless_set(self):
        cpus = len(os.sched_getaffinity(0))
        derived = environments("-np", "4", env={"OMP_NUM_THREADS": None})
        self.assertEqual({e["OMP_NUM_THREADS"] for e in derived.values()}, {str(max(1, cpus // 4))})
        kept = environments("-np", "2", env={"OMP_NUM_THREADS": "3"})
        self.assertEqual({e["OMP_NUM_THREADS"] for e in kept.values()}, {"3"})
        # `export OMP_NUM_THREADS=$UNSET`: OpenMP takes empty as unset (all cores to every worker)
        empty = environments("-np", "4", env={"OMP_NUM_THREADS": ""})
        self.assertEqual({e["OMP_NUM_THREADS"] for e in empty.values()}, {str(max(1, cpus // 4))})

    def test_torchrun_and_gpu_spellings(self):
        self.assertEqual(len(environments("--nproc-per-node", "3", env={"CUDA_VISIBLE_DEVICES": ""})), 3)
        self.assertEqual(len(environments("--nproc_per_node", "2", env={"CUDA_VISIBLE_DEVICES": ""})), 2)
        self.assertEqual(len(environments("-n", "2", env={"CUDA_VISIBLE_DEVICES": ""})), 2)


class GpuPinning(unittest.TestCase):
    def test_local_ranks_get_the_inherited_visible_devices_in_order(self):
        envs = environments("-N", "1", "--gpus-per-node", "4", env={"CUDA_VISIBLE_DEVICES": "2,3,5,7"})
        self.assertEqual({r: e["CUDA_VISIBLE_DEVICES"] for r, e in envs.items()}, {0: "2", 1: "3", 2: "5", 3: "7"})

    def test_np_alone_pins_when_gpus_are_visible(self):
        envs = environments("-np", "2", env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"})
        self.assertEqual({r: e["CUDA_VISIBLE_DEVICES"] for r, e in envs.items()}, {0: "GPU-aaaa", 1: "GPU-bbbb"})

    def test_more_gpu_workers_than_gpus_is_an_error_naming_both_numbers(self):
        result = ddl("run", "-np", "4", "--", "true", env={"CUDA_VISIBLE_DEVICES": "0,1"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("4 GPU workers per node but this node has 2 GPU(s)", result.stderr)
        self.assertIn("--share-gpus", result.stderr)

    def test_sharing_and_cpu_flags(self):
        shared = environments("-np", "4", "--share-gpus", env={"CUDA_VISIBLE_DEVICES": "0,1"})
        self.assertEqual([shared[r]["CUDA_VISIBLE_DEVICES"] for r in range(4)], ["0", "1", "0", "1"])
        cpu = environments("-np", "3", "--cpu", env={"CUDA_VISIBLE_DEVICES": "0"})
        self.assertEqual({e["CUDA_VISIBLE_DEVICES"] for e in cpu.values()}, {"0"})


class ProgramArguments(unittest.TestCase):
    """Everything from the program's name on is the program's, untouched, with or without "--"
    (docs/run.md); ddl's own "-np" spelling must not reach into it."""
    PRINT_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"
    MPI_STYLE = ["--epochs", "3", "-np", "7", "-np=3", "--np", "2", "--"]

    def argv_seen(self, *args):
        result = ddl(*args)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(lines_by_rank(result.stdout)[0][0])

    def test_without_dashes_the_programs_np_and_dashes_stay_as_typed(self):
        self.assertEqual(self.argv_seen("-np", "1", PYTHON, "-c", self.PRINT_ARGV, *self.MPI_STYLE), self.MPI_STYLE)
        self.assertEqual(self.argv_seen("-np=1", PYTHON, "-c", self.PRINT_ARGV, "-np"), ["-np"])

    def test_after_dashes_likewise(self):
        self.assertEqual(self.argv_seen("-np", "1", "--", PYTHON, "-c", self.PRINT_ARGV, *self.MPI_STYLE), self.MPI_STYLE)

    def test_submit_writes_the_programs_arguments_as_typed(self):
        result = ddl_raw("submit", "--site", "perlmutter", "-N", "1", "-t", "00:10:00", "-A", "m1234_g", "-q", "regular",
                         "--dry-run", "python3", "train.py", "-np", "7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(" -- python3 train.py -np 7\n", result.stdout)


    def test_an_option_value_that_reads_np_stays_as_typed(self):
        # Only ddl's own -np flag is respelled for CLI11, not a value that happens to read "-np".
        result = ddl_raw("submit", "--site", "perlmutter", "-N", "1", "-t", "00:10:00", "-A", "m1234_g", "-q", "regular",
                         "--dry-run", "-J", "-np", "--comment", "-np=3", "--", "python3", "train.py")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("#SBATCH --job-name=-np\n", result.stdout)
        self.assertIn("#SBATCH --comment=-np=3\n", result.stdout)
        with tempfile.TemporaryDirectory() as tmp:
            result = ddl("-np", "1", "--output-dir", "-np", "--", "true", cwd=tmp)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(os.listdir(tmp), ["-np"])

class ProgramsThatCannotRun(unittest.TestCase):
    """A program that cannot run is one clear error before any worker starts (docs/run.md)."""

    def test_an_empty_program_name_is_a_usage_error_as_no_program_is(self):
        for program in ([""], []):
            result = ddl("-np", "1", "--", *program)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertEqual(result.stderr.splitlines()[0], "ddl: error: no program to run")

    def test_a_script_without_a_shebang_line_is_refused_with_its_interpreter(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_executable(tmp, "t.py", "print('started')\n")
            result = ddl("-np", "2", "--", "./t.py", cwd=tmp)
        self.assertEqual(result.returncode, 127, result.stderr)
        self.assertEqual(result.stdout, "")  # no worker started
        self.assertEqual(result.stderr.splitlines(), [
            "ddl: error: program './t.py' is neither a binary nor a script with a #! line, so it cannot be run",
            "hint: add a first line such as #!/usr/bin/env python3, or run it through its interpreter: "
            "ddl run ... -- python3 ./t.py"])

    def test_a_program_in_the_current_folder_but_not_in_path_gets_dot_slash_suggested(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "train.py"), "w") as f:
                f.write("#!/usr/bin/env python3\n")
            result = ddl("-np", "1", "--", "train.py", cwd=tmp)
        self.assertEqual(result.returncode, 127, result.stderr)
        self.assertIn("program 'train.py' was not found in PATH", result.stderr)
        self.assertIn("hint: run it as ./train.py or as python3 train.py", result.stderr)


class UnknownWords(unittest.TestCase):
    """Every command refuses a flag it does not know, naming the command and the flag, before doing
    anything (a script waiting for `check-build --json` must not get the text report)."""
    COMMANDS = [["run"], ["exec"], ["submit"], ["sites"], ["sites", "show", "perlmutter"], ["status"], ["cancel"],
                ["jupyter"], ["jupyter", "start"], ["jupyter", "tunnel"], ["jupyter", "stop"], ["check-build"]]

    def test_every_command_refuses_an_unknown_flag_naming_it(self):
        for command in self.COMMANDS:
            with self.subTest(command):
                result = ddl_raw(*command, "--jsn", timeout=60)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertEqual(result.stdout, "")
                name = " ".join(c for c in command if c != "perlmutter")
                self.assertEqual(result.stderr.splitlines(),
                                 [f"ddl: error: ddl {name} has no option --jsn", f"hint: see `ddl {name} --help`"]
                                 if command[0] not in ("run", "exec", "submit") else result.stderr.splitlines())
                self.assertIn(f"ddl {name} has no option --jsn", result.stderr)

    def test_the_usage_line_of_a_command_that_runs_a_program_shows_where_the_program_goes(self):
        for command in ("run", "exec", "submit"):
            with self.subTest(command):
                result = ddl_raw(command, "--help", timeout=60)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn(f"Usage: ddl {command} [OPTIONS] [--] PROGRAM [ARGS...]\n", result.stdout)

    def test_a_mistyped_or_missing_command_is_named_and_run_suggested(self):
        result = ddl_raw("runn", "-np", "2", "--", "./x")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.splitlines()[0], "ddl: error: 'runn' is not a ddl command")
        self.assertIn("did you mean `ddl run`?", result.stderr)
        result = ddl_raw("-np", "2", "--", "./x")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.splitlines()[0], "ddl: error: -np comes before a command")
        self.assertIn("`ddl run -np ...`", result.stderr)


class UsageErrors(unittest.TestCase):
    def test_several_nodes_outside_an_allocation_says_how_to_get_one(self):
        result = ddl("run", "-N", "2", "--", "true")
        self.assertEqual(result.returncode, 2)
        self.assertRegex(result.stderr, r"-N 2 needs an allocation of 2 nodes")
        self.assertIn("salloc", result.stderr)

    def test_bad_flag_values_are_one_line_errors(self):
        # A remote shell that is not there is the flag's mistake (it read as the program's, exit 127).
        rsh = (["-H", "ddl-test-nohost:1", "--rsh", "no-such-remote-shell"], "the remote shell for -H/--hostfile: program "
                                                                              "'no-such-remote-shell' was not found in PATH")
        for args, needle in ((["-np", "0"], "--np"), (["-np", "x"], "--np"), (["--bogus"], "--bogus"), (["--bogus", "true"], "--bogus"),
                             rsh):
            result = ddl("run", *args, "--", "true") if args[-1] != "true" else ddl("run", *args)
            self.assertEqual(result.returncode, 2, args)
            self.assertTrue(result.stderr.startswith("ddl: error:"), result.stderr)
            self.assertIn(needle, result.stderr.splitlines()[0])

    def test_an_error_quoting_a_100000_character_value_is_cut_to_a_readable_line(self):
        huge = "a" * 100000
        for args in (["sites", "show", huge], ["cancel", "1" * 100000], ["run", "-np", "1", "--", huge]):
            result = ddl_raw(*args)
            self.assertNotEqual(result.returncode, 0, args[:2])
            first = result.stderr.splitlines()[0]
            self.assertTrue(first.startswith("ddl: error: "), first[:200])
            self.assertLess(len(result.stderr), 10000, args[:2])

    def test_a_host_list_of_this_host_only_runs_without_a_remote_shell(self):
        # Every worker starts here: ssh is not needed, so a PATH without it (a container) still runs.
        bin_dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, bin_dir)
        os.symlink(shutil.which("echo"), os.path.join(bin_dir, "echo"))
        result = ddl_raw("run", "--cpu", "-H", "localhost:2", "--", "echo", "here", env={"PATH": bin_dir})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(result.stdout.splitlines()), ["[0] here", "[1] here"])
        result = ddl_raw("run", "--cpu", "-H", "localhost:1,ddl-test-nohost:1", "--", "echo", "here", env={"PATH": bin_dir})
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("the remote shell for -H/--hostfile: program 'ssh' was not found in PATH", result.stderr.splitlines()[0])

    def test_this_host_named_twice_in_the_host_list_is_refused_naming_both(self):
        # localhost and this host's name would be two nodes planned on the same GPUs.
        result = ddl_raw("run", "--cpu", "-H", f"localhost:2,{socket.gethostname()}:1", "--", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.splitlines()[0],
                         f"ddl: error: the host list names this host 2 times (localhost, {socket.gethostname()})")
        self.assertIn("localhost:3", result.stderr)

    def test_a_decimal_grace_period_is_taken(self):
        for seconds in ("0.5", ".5", "5.", "0"):
            self.assertEqual(ddl("run", "--grace-period", seconds, "-np", "1", "--", "true").returncode, 0, seconds)

    def test_a_flag_given_twice_is_named_with_what_to_do(self):
        for args, says in ((["run", "-np", "2", "-np", "3"], "ddl: error: --np is given 2 times; give it once"),
                           (["submit", "--site", "slurm", "--dry-run", "-J", "a", "-J", "b"], "ddl: error: --job-name is given 2 times; give it once")):
            result = ddl_raw(*args, "--", "true")
            self.assertEqual(result.returncode, 2, args)
            self.assertEqual(result.stderr.splitlines()[0], says, args)

    def test_whole_numbers_with_leading_zeros_are_decimal_not_octal(self):
        # CLI11 reads integers as C's strtol with base 0: -np 010 started 8 workers, and 08 was no number.
        result = ddl("run", "-np", "010", "--max-restarts", "09", "--", "sh", "-c", "echo $WORLD_SIZE $TORCHELASTIC_MAX_RESTARTS")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(lines_by_rank(result.stdout)), list(range(10)))
        self.assertEqual({lines[0] for lines in lines_by_rank(result.stdout).values()}, {"10 9"})
        script = ddl_raw("submit", "--site", "slurm", "--dry-run", "--signal-before", "0120", "--max-requeues", "010", "--requeue",
                         "-t", "01:00:00", "--", "python3", "train.py")
        self.assertEqual(script.returncode, 0, script.stderr)
        self.assertIn("#SBATCH --signal=B:USR1@120\n", script.stdout)
        self.assertIn("--max-requeues 10 ", script.stdout)

    def test_empty_values_are_refused_not_taken_as_the_default(self):
        for args, flag in ((["run", "--rsh", "", "-H", "localhost:1"], "--rsh"), (["run", "--torch-backend", "", "-np", "1"], "--torch-backend"),
                           (["run", "--mpi", "", "-np", "1"], "--mpi"),
                           (["submit", "--site", "perlmutter", "--dry-run", "-J", "", "-A", "m1_g", "-N", "1", "-t", "10"], "--job-name")):
            result = ddl_raw(*args, "--", "true")
            self.assertEqual(result.returncode, 2, args)
            self.assertEqual(result.stderr.splitlines()[0], f"ddl: error: {flag}: must not be empty", args)

    def test_numbers_that_are_not_numbers_are_refused_with_the_range(self):
        for args, says in ((["-np", "0"], "--np: must be a whole number from 1 to 1048576, not 0"),
                           (["-np", "abc"], "--np: must be a whole number from 1 to 1048576, not abc"),
                           (["-np", "2.5"], "not 2.5"),
                           (["--grace-period", "nan", "-np", "1"], "--grace-period: must be a number of seconds from 0 to 86400, not nan"),
                           (["--grace-period", "1e300", "-np", "1"], "not 1e300"),
                           (["--grace-period", "inf", "-np", "1"], "not inf"),
                           # strtol's and strtod's extras: a sign, blanks, hex
                           (["-np", "+2"], "--np: must be a whole number from 1 to 1048576, not +2"),
                           (["-np", " 2"], "not  2"),
                           (["--grace-period", "0x10", "-np", "1"], "--grace-period: must be a number of seconds from 0 to 86400, not 0x10"),
                           (["--max-restarts", "-1", "-np", "1"], "--max-restarts: must be a whole number from 0 to 1000000, not -1"),
                           (["-np", "0x2"], "--np: must be a whole number from 1 to 1048576, not 0x2")):
            result = ddl("run", *args, "--", "true")
            self.assertEqual(result.returncode, 2, args)
            self.assertIn(says, result.stderr.splitlines()[0])
            self.assertLess(len(result.stderr.splitlines()[0]), 200)

    def test_libddl_settings_are_checked_once_by_ddl_run_before_any_worker_starts(self):
        for name, value, says in (("DDL_TIMEOUT", "nan", "DDL_TIMEOUT='nan' is not a number from 0 to 31536000"),
                                  ("DDL_TIMEOUT", "inf", "DDL_TIMEOUT='inf' is not a number"),
                                  ("DDL_TIMEOUT", "0", "DDL_TIMEOUT=0 would fail every wait at once"),
                                  ("DDL_TIMEOUT", "0.0001", "DDL_TIMEOUT=0.0001 would fail every wait at once"),
                                  ("DDL_TIMEOUT", "10s", "DDL_TIMEOUT='10s' is not a number"),
                                  ("DDL_CYCLE_TIME_MS", "-1", "DDL_CYCLE_TIME_MS='-1' is not a number from 0 to 60000"),
                                  ("DDL_FUSION_THRESHOLD", "1e99", "DDL_FUSION_THRESHOLD='1e99' is not a number")):
            result = ddl("run", "-np", "2", "--", "sh", "-c", "echo started", env={name: value})
            self.assertEqual(result.returncode, 2, (name, value, result.stderr))
            self.assertIn(says, result.stderr.splitlines()[0])
            self.assertNotIn("started", result.stdout)


class ErrorLines(unittest.TestCase):
    def test_a_nul_in_a_quoted_value_is_shown_not_the_end_of_the_message(self):
        with tempfile.NamedTemporaryFile("wb", suffix=".hosts") as hostfile:
            hostfile.write(b"localhost slots=2\0junk\n")
            hostfile.flush()
            result = ddl("--hostfile", hostfile.name, "--", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        first = result.stderr.splitlines()[0]
        self.assertIn("\\0junk", first)
        self.assertNotIn("\0", result.stderr)

    def test_a_scheduler_job_without_its_node_list_says_which_variable(self):
        for env, says in (({"PBS_JOBID": "5.pbs"}, "ddl: error: inside PBS job 5.pbs but PBS_NODEFILE is not set"),
                          ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": ""}, "ddl: error: inside Slurm job 5 but SLURM_JOB_NODELIST is empty")):
            result = ddl("-np", "1", "--", "true", env=env)
            self.assertNotEqual(result.returncode, 0, env)
            self.assertEqual(result.stderr.splitlines()[0], says, env)


class PathFlags(unittest.TestCase):
    def test_path_flags_written_flag_equals_tilde_are_under_home(self):
        # The shell expands a word's leading ~, not one after `--flag=`: ddl does it for its path flags.
        with tempfile.TemporaryDirectory() as home:
            env = {"HOME": home}
            run = ddl("-np", "2", "--output-dir=~/runs/a", "--", "sh", "-c", "echo out $RANK", env=env)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(sorted(os.listdir(os.path.join(home, "runs", "a"))), ["rank.0.err", "rank.0.out", "rank.1.err", "rank.1.out"])
            hostfile = ddl("--hostfile=~/hosts", "--", "true", env=env)
            self.assertEqual(hostfile.stderr.splitlines()[0], f"ddl: error: --hostfile {home}/hosts: No such file or directory")
            submit = ddl_raw("submit", "--site", "slurm", "--dry-run", "--output=~/logs/%j.out", "--", "python3", "train.py", env=env)
            self.assertIn(f"#SBATCH --output={home}/logs/%j.out\n", submit.stdout, submit.stderr)
            jupyter = ddl_raw("jupyter", "start", "--site", "slurm", "--env=~/venvs/torch", "--dry-run", env=env)
            self.assertIn(f"source {home}/venvs/torch/bin/activate\n", jupyter.stdout, jupyter.stderr)
            probe = ddl_raw("check-build", "--python=~/venv/bin/python3", env=env)
            self.assertIn(f"Frameworks ({home}/venv/bin/python3)", probe.stdout, probe.stderr)
            self.assertFalse(os.path.exists("~"))


if __name__ == "__main__":
    unittest.main()
