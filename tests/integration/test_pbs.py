"""PBS cannot run on this machine (no PBS server here), so the most real thing is tested instead:
the script `ddl submit` renders for a PBS site is executed by bash as a PBS job would run it, with
the variables PBS sets (PBS_JOBID, PBS_NODEFILE, PBS_O_WORKDIR, NCPUS), and its `ddl run` starts
the workers through real OpenMPI `mpirun --hostfile $PBS_NODEFILE`, each through `ddl exec`.
Polaris' Cray PALS mpiexec does not exist outside Cray systems: its scripts are golden files only
(tests/fixtures/scripts, checked by the unit tests)."""
import json
import os
import re
import socket
import subprocess
import tempfile
import unittest

from ddl_testing import DDL, PYTHON, lines_by_rank

SHOW_WORKER = ("import os, sys, json; print('WORKER ' + json.dumps({k: os.environ.get(k) for k in "
               "['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'GROUP_RANK', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR', 'OMP_NUM_THREADS', "
               "'OMPI_MCA_pml', 'OMPI_COMM_WORLD_RANK', 'DDL_RUN_ID', 'DDL_ARRAY_INDEX']} | {'cwd': os.getcwd(), 'argv': sys.argv[1:]}))")


def render(*args, program_args=()):
    result = subprocess.run([DDL, "submit", *args, "--dry-run", "--", PYTHON, "-c", SHOW_WORKER, *program_args], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_as_pbs_job(script, workdir, gpus="0,1,2,3", extra_env=None, other_nodes=()):
    """Runs `script` with bash as PBS would on the job's first node (this host), with `extra_env` too;
    `other_nodes` are written into the node file before this host."""
    nodefile = os.path.join(workdir, "nodefile")
    with open(nodefile, "w") as f:
        f.write("".join(f"{node}\n" for node in (*other_nodes, socket.gethostname())))
    path = os.path.join(workdir, "job.sh")
    with open(path, "w") as f:
        f.write(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "DDL_", "OMPI_"))}
    env.update({"PBS_JOBID": "4242.pbs-test", "PBS_NODEFILE": nodefile, "PBS_O_WORKDIR": workdir, "CUDA_VISIBLE_DEVICES": gpus})
    env.update(extra_env or {})
    return subprocess.run(["bash", path], env=env, cwd="/", capture_output=True, text=True, timeout=300)


def workers(output):
    return {rank: json.loads(line[len("WORKER "):]) for rank, lines in lines_by_rank(output).items() if rank is not None
            for line in lines if line.startswith("WORKER ")}


class PbsScriptsWithoutPbs(unittest.TestCase):
    def test_the_sockeye_script_starts_one_worker_per_gpu_through_real_mpirun(self):
        script = render("--site", "sockeye", "-N", "1", "-A", "st-alice-1-gpu", "-t", "00:10:00")
        self.assertIn("#PBS -l select=1:ncpus=8:ngpus=4:mem=64gb", script)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(script, tmp)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            found = workers(result.stdout)
            self.assertEqual(sorted(found), [0, 1, 2, 3])
            for rank, w in found.items():
                self.assertEqual((w["RANK"], w["WORLD_SIZE"], w["LOCAL_RANK"], w["GROUP_RANK"]), (str(rank), "4", str(rank), "0"))
                self.assertEqual(w["CUDA_VISIBLE_DEVICES"], str(rank))
                self.assertEqual(w["OMPI_COMM_WORLD_RANK"], str(rank))  # really started by mpirun
                self.assertEqual(w["OMP_NUM_THREADS"], "2")             # the profile's 2 cores per GPU
                self.assertEqual(w["OMPI_MCA_pml"], "ob1")              # the profile's environment
                self.assertEqual(w["MASTER_ADDR"], socket.gethostname())
                self.assertEqual(w["cwd"], tmp)                         # cd "$PBS_O_WORKDIR"
                self.assertTrue(w["DDL_RUN_ID"].startswith("4242.pbs-test"))

    def test_an_array_element_s_workers_get_its_index_and_the_directive_is_one_range(self):
        script = render("--site", "sockeye", "-N", "1", "-A", "st-alice-1-gpu", "-t", "00:10:00", "--array", "0-15%4")
        self.assertIn("#PBS -J 0-15%4\n", script)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(script, tmp, extra_env={"PBS_ARRAY_INDEX": "7", "PBS_JOBID": "4243[7].pbs-test"})
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            found = workers(result.stdout)
            self.assertEqual(sorted(found), [0, 1, 2, 3])
            self.assertEqual({w["DDL_ARRAY_INDEX"] for w in found.values()}, {"7"})
        plain = run_as_pbs_job(render("--site", "sockeye", "-N", "1", "-A", "st-alice-1-gpu", "-t", "00:10:00"), tempfile.mkdtemp())
        self.assertEqual({w["DDL_ARRAY_INDEX"] for w in workers(plain.stdout).values()}, {None})
        for spec, why in (("1,3,5", "whose arrays are one range"), ("4-4", "needs an end above its start"), ("x", "one range")):
            refused = subprocess.run([DDL, "submit", "--site", "sockeye", "-A", "st-alice-1-gpu", "--array", spec, "--dry-run", "--", "true"],
                                     capture_output=True, text=True, timeout=60)
            self.assertEqual(refused.returncode, 2, refused.stdout)
            self.assertIn(f"--array '{spec}'", refused.stderr)
            self.assertIn(why, refused.stderr)

    def test_program_arguments_reach_every_rank_unchanged_through_mpirun(self):
        # mpirun reads a lone ":" as the start of another program (MPMD): the words would vanish,
        # or run a program of their own.
        with tempfile.TemporaryDirectory() as tmp:
            pwned = os.path.join(tmp, "pwned")
            words = ["--sep", ":", "-np", "1", "/usr/bin/touch", pwned, "\\:", "\\\\:", "a b", "$HOME", ":"]
            script = render("--site", "pbs", "-N", "1", "--gpus-per-node", "2", "-c", "1", program_args=words)
            result = run_as_pbs_job(script, tmp, gpus="0,1")
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            found = workers(result.stdout)
            self.assertEqual(sorted(found), [0, 1])
            for w in found.values():
                self.assertEqual(w["argv"], words)
            self.assertFalse(os.path.exists(pwned))

    def test_a_variable_with_a_100000_character_name_reaches_the_workers(self):
        # ddl run names every variable to mpirun (-x NAME); checking the name with std::regex
        # recursed once per character and overflowed the stack (a segfault before any worker).
        name = "V" * 100000
        script = render("--site", "pbs", "-N", "1", "--gpus-per-node", "2", "-c", "1")
        *setup, exec_line = script.strip().splitlines()
        program = f"{PYTHON} -c \"import os; print('LONG', os.environ.get('V' * 100000))\""
        job = "\n".join(setup + [exec_line.split(" -- ")[0] + " -- " + program]) + "\n"
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(job, tmp, gpus="0,1", extra_env={name: "kept"})
            self.assertEqual(result.returncode, 0, (result.stdout + result.stderr)[-2000:])
            said = {rank: lines for rank, lines in lines_by_rank(result.stdout).items() if rank is not None}
            self.assertEqual(sorted(said), [0, 1])
            for lines in said.values():
                self.assertIn("LONG kept", lines)

    def test_a_worker_that_prints_an_mpirun_tag_keeps_its_line_and_its_rank(self):
        # mpirun --tag-output tags pieces inside lines too; text of rank 0 that reads like rank 1's
        # tag went to rank 1, and rank 0's next line was glued to it.
        script = render("--site", "pbs", "-N", "1", "--gpus-per-node", "2", "-c", "1")
        *setup, exec_line = script.strip().splitlines()
        program = (f"{PYTHON} -c \"import os, time; r = os.environ['RANK']; "
                   "print('rank0 says [1,1]<stdout>:FAKE' if r == '0' else 'quiet', flush=True); time.sleep(0.3); "
                   "print('normal from ' + r, flush=True)\"")
        job = "\n".join(setup + [exec_line.split(" -- ")[0] + " -- " + program]) + "\n"
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(job, tmp, gpus="0,1")
            self.assertEqual(result.returncode, 0, (result.stdout + result.stderr)[-2000:])
            said = {rank: lines for rank, lines in lines_by_rank(result.stdout).items() if rank is not None}
            self.assertEqual(said, {0: ["rank0 says [1,1]<stdout>:FAKE", "normal from 0"], 1: ["quiet", "normal from 1"]})

    def test_a_node_left_out_with_exclude_gets_no_task_from_mpirun(self):
        # The node file's first node does not exist: mpirun would fail on it, so the run shows it
        # was left out (mpirun --host this-host:4 instead of the node file).
        script = render("--site", "sockeye", "-N", "1", "-A", "st-alice-1-gpu", "-t", "00:10:00")
        job = re.sub(r"( run -N 1 )", r"\1--exclude bad-node-7.pbs-test ", script, count=1)
        self.assertNotEqual(job, script)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(job, tmp, other_nodes=("bad-node-7.pbs-test",))
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertEqual(sorted(workers(result.stdout)), [0, 1, 2, 3])
            self.assertIn(f"ddl: leaving out 1 of PBS job 4242.pbs-test's nodes: running on {socket.gethostname()}\n", result.stderr)
            # Without it the same job's mpirun goes to the bad node first, and fails.
            failed = run_as_pbs_job(script, tmp, other_nodes=("bad-node-7.pbs-test",))
            self.assertNotEqual(failed.returncode, 0, failed.stdout)
        # ddl submit cannot: a PBS select names the nodes a job wants, never those it does not.
        refused = subprocess.run([DDL, "submit", "--site", "sockeye", "-N", "1", "-A", "st-alice-1-gpu", "-t", "00:10:00", "--exclude",
                                  "bad-node-7", "--dry-run", "--", "true"], capture_output=True, text=True, timeout=60)
        self.assertEqual(refused.returncode, 2, refused.stdout + refused.stderr)
        self.assertIn("ddl: error: --exclude: site 'sockeye' uses PBS, which cannot keep a job off named nodes", refused.stderr)
        self.assertEqual(refused.stdout, "")

    def test_ncpus_that_is_no_count_is_an_error_naming_it_not_threads_by_the_million(self):
        # Read with atoi, NCPUS=99999999999 gave each worker OMP_NUM_THREADS=607876095.
        script = render("--site", "pbs", "-N", "1", "--gpus-per-node", "2", "-c", "1")
        job = script.replace("cd \"$PBS_O_WORKDIR\"", "cd \"$PBS_O_WORKDIR\"\nexport NCPUS=99999999999", 1)
        self.assertNotEqual(job, script)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_as_pbs_job(job, tmp, gpus="0,1")
        self.assertNotEqual(result.returncode, 0, result.stdout)
        self.assertIn("ddl: error: NCPUS='99999999999' is not a count of cores PBS sets (0 to 1048576)", result.stderr)
        self.assertNotIn("WORKER ", result.stdout)

    def test_a_failing_worker_ends_the_generic_pbs_job_with_its_code(self):
        script = render("--site", "pbs", "-N", "1", "--gpus-per-node", "2", "-c", "1")
        with tempfile.TemporaryDirectory() as tmp:
            # The rendered script with its program swapped for one whose rank 1 fails.
            *setup, exec_line = script.strip().splitlines()
            program = "bash -c 'echo bye from $RANK >&2; [ $RANK = 1 ] && exit 9; sleep 60'"
            failing = "\n".join(setup + [exec_line.split(" -- ")[0] + " -- " + program]) + "\n"
            result = run_as_pbs_job(failing, tmp, gpus="0,1")
            self.assertEqual(result.returncode, 9, result.stdout + result.stderr)
            # ddl names the rank that mpirun names ("Process name: [[job,1],1]"). OpenMPI 4.1 does
            # not always print that block (once in CI it printed only "Primary job terminated
            # normally, but 1 process returned a non-zero exit code"): then ddl must say so, not guess.
            if re.search(r"Process name:\s*\[\[\d+,\d+\],1\]", result.stderr):
                self.assertIn(f"ddl: error: rank 1 on {socket.gethostname()} exited with code 9", result.stderr)
                self.assertIn("| bye from 1", result.stderr)
            else:
                self.assertIn("ddl: error: mpirun exited with code 9 without naming a failed rank", result.stderr)
                self.assertIn("[1] bye from 1", result.stderr)

    def test_an_output_file_a_rank_cannot_open_late_is_given_up_with_a_warning_under_mpirun(self):
        # Under a task launcher a rank's --output-dir files are opened at its first line; one that
        # cannot be opened then (here: the folder was removed) is a warning, not the run's end.
        with tempfile.TemporaryDirectory() as tmp:
            nodefile = os.path.join(tmp, "nodefile")
            with open(nodefile, "w") as f:
                f.write(socket.gethostname() + "\n")
            out_dir = os.path.join(tmp, "od")
            program = ('if [ "$RANK" = 0 ]; then echo early; sleep 1; rm -rf "$OD"; touch "$OD.gone"; '
                       'else i=0; while [ ! -e "$OD.gone" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo late; fi')
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "DDL_", "OMPI_"))}
            env.update({"PBS_JOBID": "4243.pbs-test", "PBS_NODEFILE": nodefile, "OD": out_dir})
            result = subprocess.run([DDL, "run", "--cpu", "--nproc-per-node", "2", "--launcher", "mpirun", "--output-dir", out_dir,
                                     "--", "bash", "-c", program], env=env, cwd=tmp, capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn("late", lines_by_rank(result.stdout)[1])
            self.assertIn(f"ddl: warning: --output-dir: cannot write {out_dir}/rank.1.out", result.stderr)
            self.assertIn("rank 1's output goes on to ddl's own only", result.stderr)


if __name__ == "__main__":
    unittest.main()
