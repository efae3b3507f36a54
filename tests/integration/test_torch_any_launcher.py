"""The "ddl" backend and ddl.torch started without a launcher that gives libddl its world: PyTorch's
mp.spawn pattern, torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Debian's torch
1.13 torchrun itself fails under Python 3.11 before any worker starts, so the test starts the
processes with the variables torchrun sets), and a plain `srun` on the project's Slurm (MpiDefault
none: no PMIx). libddl's world then comes through torch's store (ddl_init_with_store)."""
import os
import re
import socket
import subprocess
import tempfile
import unittest

from ddl_testing import DDL, PYTHON, slurm_env, start_local_slurm

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("DDL_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
PACKAGE = os.path.join(BUILD, "python")


def free_ports(n):
    """`n` distinct ports free now (all held open while the next is picked)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port():
    return free_ports(1)[0]


def clean_env(**extra):
    """This process's environment without any launcher's world (ddl run, PMIx, Slurm)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "PMIX_", "OMPI_", "SLURM_"))}
    return {**env, "PYTHONPATH": PACKAGE, "DDL_TIMEOUT": "60", **extra}


def run_as_torchrun(size, *argv, timeout=300):
    """Starts `size` processes with the environment torchrun gives its workers; returns each one's
    (returncode, stdout + stderr)."""
    port = free_port()
    procs = []
    for rank in range(size):
        env = clean_env(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
                        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DDL_DEBUG="1")
        procs.append(subprocess.Popen([PYTHON, *argv], env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            p.kill()
    return results


class MpSpawn(unittest.TestCase):
    def check(self, size, launcher=(), launched=1):
        """spawn_train.py's workers, started by one process: alone, or by each of the `launched`
        workers of `launcher` (each starting a world of its own)."""
        result = subprocess.run([*launcher, PYTHON, os.path.join(HERE, "spawn_train.py"), str(size),
                                 *map(str, free_ports(2 * launched))],
                                env=clean_env(), capture_output=True, text=True, timeout=300)
        output = result.stdout[-4000:] + result.stderr[-4000:]
        self.assertEqual(result.returncode, 0, output)
        for which in range(launched):
            self.check_world(size, [line.removeprefix(f"[{which}] ") for line in result.stdout.splitlines()
                                    if not launcher or line.startswith(f"[{which}] ")], output)

    def check_world(self, size, lines, output):
        total = float(sum(range(1, size + 1)))
        gathered = [[r, r * 10] for r in range(size)]
        for rank in range(size):
            said = [line.removeprefix(f"rank {rank}: ") for line in lines if line.startswith(f"rank {rank}: ")]
            self.assertIn("world source program store", said, output)
            self.assertIn(f"all_reduce {[total] * 4}", said, output)
            self.assertIn(f"all_gather {gathered}", said, output)
            self.assertIn(f"broadcast {[float(size - 1)]}", said, output)
            if rank in (0, size - 1):
                self.assertIn(f"subgroup all_reduce {[float(size - 1)]}", said, output)
            self.assertIn("replicas identical True", said, output)  # after destroy_process_group and init again

    def test_two_ranks(self):
        self.check(2)

    def test_three_ranks(self):
        self.check(3)

    def test_two_ranks_spawned_by_the_one_worker_of_ddl_run(self):
        # PyTorch's ImageNet example under a launcher: the world the workers name (2) is theirs, not
        # the launcher's (1), whose variables they inherit; it was refused as "pass world_size=1".
        self.check(2, launcher=(DDL, "run", "-np", "1", "--"))

    def test_two_ranks_spawned_by_each_of_two_workers_of_ddl_run(self):
        # Worlds of the launcher's size: a spawned worker whose torch rank differed from its
        # launched parent's joined the launcher's world in another's place, and every rank waited
        # for DDL_TIMEOUT. multiprocessing's children join through torch's store.
        self.check(2, launcher=(DDL, "run", "-np", "2", "--"), launched=2)

    def test_a_subprocess_of_a_launched_worker_with_another_rank_is_refused_at_once(self):
        # Lightning's own launcher under srun or ddl run: a subprocess (not multiprocessing's) with
        # the launcher's variables and torch's rank 1 where the launcher gave its parent rank 0.
        child = ("import os, torch.distributed as dist, ddl.distributed\n"
                 "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
                 "dist.init_process_group('ddl', rank=int(os.environ['TORCH_RANK']), world_size=1 + int(os.environ['DDL_SIZE']) - 1)\n")
        parent = ("import datetime, os, subprocess, sys, torch.distributed as dist\n"
                  "if os.environ['DDL_RANK'] == '0':  # hosts torch's store, as Lightning's rank 0 does\n"
                  "    store = dist.TCPStore('127.0.0.1', int(sys.argv[2]), 2, True, datetime.timedelta(seconds=30), wait_for_workers=False)\n"
                  "    r = subprocess.run([sys.executable, '-c', sys.argv[1]], env={**os.environ, 'TORCH_RANK': '1', 'PORT': sys.argv[2]})\n"
                  "    sys.exit(r.returncode)\n")
        result = subprocess.run([DDL, "run", "-np", "2", "--", PYTHON, "-c", parent, child, str(free_port())],
                                env=clean_env(DDL_TIMEOUT="120"), capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("init_process_group: torch's rank 1 of 2 is not the rank the launcher gave this process (0)", result.stdout + result.stderr)


class TorchrunEnvironment(unittest.TestCase):
    def check_backend(self, size):
        results = run_as_torchrun(size, os.path.join(HERE, "torch_backend_checks.py"))
        for rank, (code, out) in enumerate(results):
            self.assertEqual(code, 0, out[-4000:])
            self.assertIn(f"ddl: rank {rank} of {size} (local rank {rank} of {size}) joined through program store", out)
            self.assertNotIn("FAIL", out, out[-4000:])
            passed = int(re.search(r"checks passed: (\d+)", out).group(1))
            self.assertGreaterEqual(passed, 43, out[-2000:])  # every collective against gloo's result, as under ddl run

    def test_every_backend_collective_against_gloo_on_2_ranks(self):
        self.check_backend(2)

    def test_every_backend_collective_against_gloo_on_3_ranks(self):
        self.check_backend(3)

    def test_hvd_init_and_the_horovod_api_checks(self):
        results = run_as_torchrun(2, os.path.join(HERE, "torch_api_checks.py"), timeout=480)
        for rank, (code, out) in enumerate(results):
            self.assertIn(f"ddl: rank {rank} of 2 (local rank {rank} of 2) joined through program store", out)
            self.assertIn("checks done, 0 failed", out, out[-4000:])
            self.assertEqual(code, 0, out[-4000:])

    def test_hvd_init_after_init_process_group_gloo_joins_through_its_store(self):
        code = ("import torch, torch.distributed as dist, ddl.torch as hvd\n"
                "dist.init_process_group('gloo')\n"
                "hvd.init()\n"
                "t = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)\n"
                "print('rank', hvd.rank(), 'of', hvd.size(), 'sum', t.item(), hvd.local_size(), flush=True)\n")
        for rank, (returncode, out) in enumerate(run_as_torchrun(2, "-c", code)):
            self.assertEqual(returncode, 0, out)
            self.assertIn(f"rank {rank} of 2 sum 3.0 2", out)
            self.assertIn("joined through program store", out)

    def test_hvd_init_whose_rank_0_never_comes_fails_within_ddl_timeout(self):
        # torch's env:// rendezvous waited its own 30 minutes for rank 0's store.
        env = clean_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DDL_TIMEOUT="3")
        result = subprocess.run([PYTHON, "-c", "import ddl.torch as hvd; hvd.init()"], env=env, capture_output=True, text=True,
                                timeout=120)
        self.assertNotEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertIn("hvd.init(): torch's env:// rendezvous at 127.0.0.1:", result.stderr)
        self.assertIn("(RANK=1, WORLD_SIZE=2) did not complete within DDL_TIMEOUT (3 s)", result.stderr)


class CApi(unittest.TestCase):
    def test_bad_arguments_are_refused_with_the_reason(self):
        code = ("import ctypes\n"
                "from ddl import _lib as L\n"
                "s = L.Store(None, L.STORE_SET(lambda *a: 0), L.STORE_GET(lambda *a: 1))\n"
                "print(L.lib.ddl_init_with_store(2, 2, ctypes.byref(s)), L.last_error())\n"
                "print(L.lib.ddl_init_with_store(0, 2, None), L.last_error())\n"
                "print(L.lib.ddl_init_with_store(1, 2, ctypes.byref(s)), L.last_error())\n"
                "print(L.lib.ddl_is_initialized(), repr(L.lib.ddl_world_source()))\n")
        result = subprocess.run([PYTHON, "-c", code], env=clean_env(DDL_TIMEOUT="1"), capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], "1 ddl_init_with_store: rank 2 of a world of 2 ranks: the rank must be at least 0 and "
                                   "below the size")
        self.assertEqual(lines[1], "1 ddl_init_with_store: the store and both its functions must be given")
        # A store whose get never finds a key: the bootstrap fails, naming the key, within DDL_TIMEOUT.
        self.assertRegex(lines[2], r"^6 ddl_init_with_store failed: the program's store did not give key 'ddl/\d+/host/0'")
        self.assertEqual(lines[3], "0 b''")


class PlainSrun(unittest.TestCase):
    """`srun -n 2 python train.py` as site recipes write it: torch's variables from Slurm's, no ddl."""

    @classmethod
    def setUpClass(cls):
        start_local_slurm()

    def test_init_process_group_ddl_under_plain_srun(self):
        code = ("import os, torch, torch.distributed as dist, ddl.distributed\n"
                "rank, size = int(os.environ['SLURM_PROCID']), int(os.environ['SLURM_NTASKS'])\n"
                "dist.init_process_group('ddl', init_method='tcp://127.0.0.1:' + os.environ['PORT'], rank=rank, world_size=size)\n"
                "t = torch.tensor([float(rank + 1)])\n"
                "dist.all_reduce(t)\n"
                "print('rank', rank, 'sum', t.item(), ddl.distributed._basics.world_source(), flush=True)\n"
                "dist.destroy_process_group()\n")
        env = {**slurm_env(), "PYTHONPATH": PACKAGE, "PORT": str(free_port()), "DDL_TIMEOUT": "60"}
        env = {k: v for k, v in env.items() if not k.startswith(("DDL_STORE", "PMIX_"))}
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run(["srun", "-N1", "-n2", "--mpi=none", PYTHON, "-c", code], env=env, cwd=tmp,
                                    capture_output=True, text=True, timeout=240)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        for rank in range(2):
            self.assertIn(f"rank {rank} sum 3.0 program store", result.stdout)

    def test_hvd_init_under_plain_srun_without_torch_s_variables_fails_on_every_task_naming_srun(self):
        # Alone, each task would train a model of its own and succeed: the silent wrong result.
        env = {k: v for k, v in {**slurm_env(), "PYTHONPATH": PACKAGE}.items() if not k.startswith(("DDL_", "PMIX_"))}
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run(["srun", "-N1", "-n2", "--mpi=none", PYTHON, "-c", "import ddl.torch as hvd; hvd.init()"],
                                    env=env, cwd=tmp, capture_output=True, text=True, timeout=240)
        self.assertNotEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stderr.count("SLURM_STEP_NUM_TASKS=2 says srun started this process as one of 2, but libddl "
                                             "cannot join the others"), 2, result.stderr)


class UnjoinableWorld(unittest.TestCase):
    """A process a launcher started as one of several, where libddl cannot join the others (no ddl
    run, no PMIx, no torch store to go by): refused at init, naming the variable, instead of
    training alone."""

    def init(self, **env):
        code = "import ddl.torch as hvd; hvd.init(); print('alone', hvd.rank(), hvd.size())"
        return subprocess.run([PYTHON, "-c", code], env=clean_env(**env), cwd=HERE, capture_output=True, text=True, timeout=120)

    def test_each_launcher_s_count_is_refused_naming_it(self):
        for name, launcher in (("WORLD_SIZE", "torchrun, mp.spawn or a site's recipe"), ("SLURM_STEP_NUM_TASKS", "srun"),
                               ("OMPI_COMM_WORLD_SIZE", "mpirun"), ("PMI_SIZE", "mpiexec")):
            with self.subTest(name=name):
                result = self.init(**{name: "4"})
                self.assertNotEqual(result.returncode, 0, result.stdout)
                self.assertIn(f"{name}=4 says {launcher} started this process as one of 4, but libddl cannot join the others",
                              result.stderr)
                self.assertIn("DDL_BOOTSTRAP=single", result.stderr)
                self.assertNotIn("alone", result.stdout)

    def test_a_world_of_one_or_ddl_bootstrap_single_runs_alone(self):
        for env in ({"WORLD_SIZE": "1"}, {"WORLD_SIZE": "4", "DDL_BOOTSTRAP": "single"}, {}):
            with self.subTest(env=env):
                result = self.init(**env)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stdout, "alone 0 1\n")


if __name__ == "__main__":
    unittest.main()
