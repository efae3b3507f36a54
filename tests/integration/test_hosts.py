"""`ddl run -H` / `--hostfile` across real hosts: the test bed of scripts/testbed.sh (network, UTS
and mount namespaces, each host with its own name, address, /dev/shm, /tmp and sshd), workers
started over real ssh. The launching host is ddlhost1; processes are looked for on the whole
machine (the hosts share its process table), by a marker unique to each test."""
import json
import os
import re
import select
import signal
import subprocess
import time
import unittest

from testbed_hosts import LIGHTNING_PYTHON, LIGHTNING_TRAIN, TESTBED, bed, lightning_reports, workers
from test_stragglers import check_straggler_report
from ddl_testing import DDL, PYTHON, SOURCE, comm, is_stopped, kill_leftovers, lines_by_rank, processes_with, unique_marker, wait_until, write_executable

CHECKS = os.environ.get("DDL_COLLECTIVE_CHECKS", os.path.join(SOURCE, "build", "tests", "collective_checks"))
HOSTS = "ddlhost1:2,ddlhost2:2"

# Prints the worker's view as JSON, then (argv[2] == "wait") sleeps until a signal ends it.
WORKER = r"""
import json, os, signal, socket, sys, time
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "DDL_STORE_ADDR", "DDL_RUN_ID", "CUDA_VISIBLE_DEVICES", "DDL_NODE_RANK", "DDL_NUM_NODES",
        "TORCHELASTIC_RESTART_COUNT", "DDL_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"]
info = {k: os.environ.get(k) for k in keys}
info["host"] = socket.gethostname()
info["cwd"] = os.getcwd()
def stop(sig, frame):
    print(f"rank {info['RANK']} on {info['host']} got {signal.Signals(sig).name}", flush=True)
    sys.exit(3)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print(json.dumps(info), flush=True)
# Says, in the bed's shared folder, that this worker's signal handlers are in place.
ready = os.path.join(sys.argv[3], f"ready.{sys.argv[1]}.")
open(ready + info["RANK"], "w").close()
def wait_for_every_other_rank():
    deadline = time.monotonic() + 60
    others = [ready + str(r) for r in range(int(info["WORLD_SIZE"])) if str(r) != info["RANK"]]
    while not all(os.path.exists(p) for p in others) and time.monotonic() < deadline:
        time.sleep(0.05)
if sys.argv[2] == "wait":
    time.sleep(120)
elif sys.argv[2] == "fail3once":
    sys.exit(9 if info["RANK"] == "3" and info["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
elif sys.argv[2].startswith("fail"):
    if info["RANK"] == sys.argv[2][4:]:
        wait_for_every_other_rank()  # so that every other rank can report the SIGTERM it gets
        print("failing on purpose", file=sys.stderr, flush=True)
        sys.exit(7)
    time.sleep(120)
"""


def on_host(host, *command, timeout=120, env=None):
    """Runs COMMAND on HOST of the bed to its end."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    full_env.update(env or {})
    return subprocess.run(["bash", TESTBED, "exec", host, *command], capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=SOURCE)


def start_on_host(host, *command):
    return subprocess.Popen(["bash", TESTBED, "exec", host, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=SOURCE)


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def children(pid, name):
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and parent(int(p)) == pid and comm(int(p)) == name]


class HostsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bed_was_up = bed("status").returncode == 0  # then it is someone else's to stop
        if cls.bed_was_up and bed("exec", "ddlhost1", "test", "-e", DDL).returncode != 0:
            raise RuntimeError(f"the running test bed does not see {DDL} (it was started from another checkout, and keeps its own /tmp): "
                               "stop it with `bash scripts/testbed.sh stop` and run again")
        started = bed("start", "2", timeout=120)
        if started.returncode != 0:
            raise RuntimeError("the test bed did not start:\n" + started.stdout + started.stderr)
        cls.shared = bed("dir").stdout.strip()

    @classmethod
    def tearDownClass(cls):
        if not cls.bed_was_up:
            bed("stop")

    def setUp(self):
        self.marker = unique_marker()
        self.addCleanup(kill_leftovers, self.marker)
        self.addCleanup(self.remove_ready_files)

    def ready_files(self):
        """The files of this test's workers that say their signal handlers are in place."""
        return [f for f in os.listdir(self.shared) if f.startswith(f"ready.{self.marker}.")]

    def remove_ready_files(self):
        for f in self.ready_files():
            os.remove(os.path.join(self.shared, f))

    def run_on_hosts(self, *ddl_args, mode="exit", timeout=120, env=None):
        return on_host("ddlhost1", DDL, "run", *ddl_args, "--", PYTHON, "-c", WORKER, self.marker, mode, self.shared, timeout=timeout, env=env)

    def wait_for_workers(self, count):
        """Waits until COUNT workers say their signal handlers are in place, then clears their word for the next launch."""
        self.assertTrue(wait_until(lambda: len(self.ready_files()) >= count, 30), "workers did not start")
        self.remove_ready_files()

    def launching_ddl(self):
        found = [p for p in processes_with(self.marker) if comm(p) == "ddl"]
        self.assertEqual(len(found), 1, found)
        return found[0]

    def assert_nothing_left(self):
        self.assertTrue(wait_until(lambda: not processes_with(self.marker), 30), f"left running: {processes_with(self.marker)}")

    def test_workers_get_global_local_and_node_ranks_on_each_host_and_reach_node_0_by_its_address(self):
        result = self.run_on_hosts("--cpu", "-H", HOSTS)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual(sorted(found), [0, 1, 2, 3])
        for rank, w in found.items():
            self.assertEqual(int(w["RANK"]), rank)
            self.assertEqual((w["WORLD_SIZE"], w["LOCAL_WORLD_SIZE"], w["GROUP_WORLD_SIZE"]), ("4", "2", "2"))
            self.assertEqual((int(w["LOCAL_RANK"]), int(w["GROUP_RANK"])), (rank % 2, rank // 2))
            self.assertEqual(w["host"], f"ddlhost{rank // 2 + 1}")
            self.assertEqual(w["MASTER_ADDR"], "198.18.0.11")  # ddlhost1 as the others reach it, never 127.0.0.1
            self.assertEqual(w["DDL_STORE_ADDR"].split(":")[0], "198.18.0.11")
            self.assertEqual(w["cwd"], SOURCE if os.path.isabs(SOURCE) else os.path.realpath(SOURCE))
        self.assertEqual(len({w["DDL_RUN_ID"] for w in found.values()}), 1)
        self.assertEqual(len({w["MASTER_PORT"] for w in found.values()}), 1)

    def test_arguments_variables_and_directory_reach_remote_workers_byte_for_byte(self):
        # Words and variables are bytes, not always UTF-8 (a Latin-1 file name, a binary token).
        show = ("import json, os, socket, sys; print('BYTES ' + json.dumps({'host': socket.gethostname(), "
                "'argv': [os.fsencode(a).hex() for a in sys.argv[1:]], 'var': os.environb.get(b'DDL_TEST_BYTES', b'').hex(), "
                "'cwd': os.getcwdb().hex(), 'pwd': os.environb.get(b'PWD', b'').hex()}))")
        words = [b"\xff\xfe", "caf\u00e9".encode(), b"", b"a b", b":", b"$HOME", b"\xc3"]
        directory = os.path.join(os.fsencode(self.shared), b"dir-\xff-" + self.marker.encode())
        os.mkdir(directory)
        self.addCleanup(os.rmdir, directory)
        result = subprocess.run(["bash", TESTBED, "exec", "ddlhost1", "env", b"DDL_TEST_BYTES=\xff\x80 x", DDL, "run", "--cpu",
                                 "-H", "ddlhost1:1,ddlhost2:1", "--", PYTHON, "-c", show, *words], capture_output=True, timeout=120,
                                cwd=directory)
        output = result.stdout.decode(errors="replace")
        self.assertEqual(result.returncode, 0, output + result.stderr.decode(errors="replace"))
        found = {rank: json.loads(line[len("BYTES "):]) for rank, lines in lines_by_rank(output).items() if rank is not None
                 for line in lines if line.startswith("BYTES ")}
        self.assertEqual([found[r]["host"] for r in sorted(found)], ["ddlhost1", "ddlhost2"])
        for w in found.values():
            self.assertEqual([bytes.fromhex(a) for a in w["argv"]], words)
            self.assertEqual(bytes.fromhex(w["var"]), b"\xff\x80 x")
            self.assertEqual(bytes.fromhex(w["cwd"]), directory)
            self.assertEqual(bytes.fromhex(w["pwd"]), directory)

    def test_a_pbs_script_s_mpirun_gives_every_node_the_job_s_environment(self):
        # PBS cannot run here: the script ddl submit renders for a generic PBS site runs with bash and
        # PBS's variables on ddlhost1, its node file naming both hosts, and real OpenMPI mpirun starts
        # the second host's task over ssh, where only what mpirun passes on (-x) exists.
        show = ("import json, os, socket, sys; print('TASK ' + json.dumps({'host': socket.gethostname(), 'argv': sys.argv[1:], "
                "'var': os.environ.get('DDL_TEST_JOB_VAR'), 'rank': os.environ.get('RANK')}))")
        script = subprocess.run([DDL, "submit", "--site", "pbs", "-N", "2", "--cpus-per-task", "1", "--dry-run", "--", PYTHON, "-c",
                                 show, ":", "a b"], capture_output=True, text=True, timeout=60)
        self.assertEqual(script.returncode, 0, script.stderr)
        path = os.path.join(self.shared, f"job.{self.marker}.sh")
        nodefile = os.path.join(self.shared, f"nodes.{self.marker}")
        with open(path, "w") as f:
            f.write(script.stdout)
        with open(nodefile, "w") as f:
            f.write("ddlhost1\nddlhost2\n")
        for made in (path, nodefile):
            self.addCleanup(os.remove, made)
        pbs = {"PBS_JOBID": f"77.{self.marker}", "PBS_NODEFILE": nodefile, "PBS_O_WORKDIR": self.shared, "NCPUS": "1",
               "DDL_TEST_JOB_VAR": "from the batch script"}
        result = on_host("ddlhost1", "bash", path, env=pbs, timeout=180)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        tasks = [json.loads(line[len("TASK "):]) for line in result.stdout.splitlines() if "TASK " in line
                 for line in [line[line.index("TASK "):]]]
        self.assertEqual(sorted((t["rank"], t["host"]) for t in tasks), [("0", "ddlhost1"), ("1", "ddlhost2")])
        for task in tasks:
            self.assertEqual(task["argv"], [":", "a b"])
            self.assertEqual(task["var"], "from the batch script")

    def test_hostfile_in_mpirun_and_horovodrun_forms(self):
        for text in ("# two hosts\nddlhost1 slots=2\nddlhost2 slots=2 max_slots=8\n", "ddlhost1:2\n\nddlhost2:2  # comment\n"):
            path = os.path.join(self.shared, f"hostfile.{self.marker}")
            with open(path, "w") as f:
                f.write(text)
            result = self.run_on_hosts("--cpu", "--hostfile", path)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertEqual({r: w["host"] for r, w in workers(result.stdout).items()},
                             {0: "ddlhost1", 1: "ddlhost1", 2: "ddlhost2", 3: "ddlhost2"})

    def test_exclude_leaves_hosts_out_unreached_and_the_run_goes_on_the_others(self):
        # nosuchhost would fail the run if it were reached; ddlhost1, left out too, is the launching host.
        result = self.run_on_hosts("--cpu", "-H", "ddlhost1:2,nosuchhost:2,ddlhost2:2", "--exclude", "nosuchhost,ddlhost1")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        found = workers(result.stdout)
        self.assertEqual({r: (w["host"], w["WORLD_SIZE"], w["MASTER_ADDR"]) for r, w in found.items()},
                         {r: ("ddlhost2", "2", "ddlhost2") for r in (0, 1)})
        self.assertIn("ddl: leaving out 2 of the hosts of -H/--hostfile: running on ddlhost2\n", result.stderr)

    def break_libddl_on(self, host):
        """Makes libddl unloadable on `host` alone, as a broken installation or file system would: an
        empty file bound over it in that host's own mount namespace, until the test ends."""
        libddl = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(DDL)), "..", "runtime", "libddl.so.0"))
        self.assertTrue(os.path.isfile(libddl), libddl)
        broken = bed("exec", host, "mount", "--bind", "/dev/null", libddl)
        self.assertEqual(broken.returncode, 0, broken.stdout + broken.stderr)
        self.addCleanup(bed, "exec", host, "umount", libddl)

    def test_preflight_names_the_host_whose_probe_fails_and_exclude_runs_on_the_others(self):
        ran = os.path.join(self.shared, f"ran.{self.marker}")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:2,ddlhost2:2", "--preflight", "--", "touch", ran)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)  # every probe passes on a good bed
        self.assertIn("ddl: preflight: 4 rank(s) on 2 host(s) passed\n", result.stderr)
        self.assertTrue(os.path.exists(ran))
        os.remove(ran)
        self.break_libddl_on("ddlhost2")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:2,ddlhost2:2", "--preflight", "--", "touch", ran)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertRegex(result.stderr, r"ddl: error: preflight: 1 host\(s\) failed, so the program was not started: ddlhost2 "
                                        r"\(libddl does not load: .*libddl\.so\.0: file too short\)\n")
        self.assertIn("hint: leave them out: --exclude ddlhost2", result.stderr)
        self.assertFalse(os.path.exists(ran), "the program ran")
        result = self.run_on_hosts("--cpu", "-H", "ddlhost1:2,ddlhost2:2", "--preflight", "exclude")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({r: (w["host"], w["WORLD_SIZE"]) for r, w in workers(result.stdout).items()},
                         {0: ("ddlhost1", "2"), 1: ("ddlhost1", "2")})
        self.assertIn("ddl: preflight: leaving out 1 host(s) that failed: ddlhost2 (libddl does not load", result.stderr)
        self.assertIn("ddl: preflight: 2 rank(s) on 1 host(s) passed\n", result.stderr)
        self.assertNotIn("ddl-preflight", result.stdout)  # the probes' own lines stay off the terminal
        # Hosts named by address: the failed one is left out by the name -H gave it.
        result = self.run_on_hosts("--cpu", "-H", "198.18.0.11:2,198.18.0.12:2", "--preflight", "exclude")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({w["host"] for w in workers(result.stdout).values()}, {"ddlhost1"})
        self.assertIn("ddl: preflight: leaving out 1 host(s) that failed: 198.18.0.12 (libddl does not load", result.stderr)

    def test_np_alone_fills_the_first_host_first(self):
        result = self.run_on_hosts("--cpu", "-H", "ddlhost1:4,ddlhost2:4", "-np", "2")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({w["host"] for w in workers(result.stdout).values()}, {"ddlhost1"})

    def test_each_host_pins_its_own_gpus(self):
        # A fake nvidia-smi answers by host: ddlhost2 has 4 GPUs. ddlhost1's own selection
        # (CUDA_VISIBLE_DEVICES=3,2) is its own and does not travel to ddlhost2.
        bin_dir = os.path.join(self.shared, f"bin.{self.marker}")
        os.makedirs(bin_dir)
        write_executable(bin_dir, "nvidia-smi", "#!/bin/sh\n[ \"$(hostname)\" = ddlhost2 ] && printf '0\\n1\\n2\\n3\\n' || printf '0\\n1\\n'\n")
        env = {"PATH": bin_dir + ":" + os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "3,2"}
        result = self.run_on_hosts("--gpus-per-node", "2", "-H", HOSTS, env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({r: w["CUDA_VISIBLE_DEVICES"] for r, w in workers(result.stdout).items()}, {0: "3", 1: "2", 2: "0", 3: "1"})
        result = self.run_on_hosts("--gpus-per-node", "4", "--share-gpus", "-H", "ddlhost1:4,ddlhost2:4", env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual([workers(result.stdout)[r]["CUDA_VISIBLE_DEVICES"] for r in range(4, 8)], ["0", "1", "2", "3"])
        # Launched from a host outside the list (a login node), with no --gpus-per-node: each host
        # still pins its own GPUs (the workers saw every GPU of their host).
        result = self.run_on_hosts("-H", "ddlhost2:2", env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({r: w["CUDA_VISIBLE_DEVICES"] for r, w in workers(result.stdout).items()}, {0: "0", 1: "1"})
        # Hosts of different sizes: every slot, each host's workers on its own GPUs.
        result = self.run_on_hosts("-H", "ddlhost1:2,ddlhost2:4", env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual({r: w["CUDA_VISIBLE_DEVICES"] for r, w in workers(result.stdout).items()},
                         {0: "3", 1: "2", 2: "0", 3: "1", 4: "2", 5: "3"})
        for hosts, error in (("ddlhost1:4,ddlhost2:2", "ddlhost1 has 2 GPU(s) for 4 GPU workers"),
                             ("ddlhost1:2,ddlhost2:5", "ddlhost2 has 4 GPU(s) for 5 GPU workers")):
            result = self.run_on_hosts("-H", hosts, env=env)
            self.assertNotEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn(error, result.stderr)

    def test_libddl_collectives_and_pytorch_ddp_across_hosts(self):
        # Shared memory within each host and Gloo between them; then Gloo alone (DDL_SHM=0).
        for hosts, per_host, env in (("ddlhost1:3,ddlhost2:3", 3, {}), (HOSTS, 2, {"DDL_SHM": "0"})):
            result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", hosts, "--", CHECKS, "world", timeout=300, env=env)
            self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
            by_rank = lines_by_rank(result.stdout)
            size = 2 * per_host
            for rank in range(size):
                self.assertIn(f"world rank {rank} size {size} local {rank % per_host}/{per_host} node {rank // per_host}", by_rank[rank])
                self.assertTrue(any(line.startswith("PASS") for line in by_rank[rank]), by_rank[rank])
        example = os.path.join(SOURCE, "examples", "pytorch_ddp.py")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:1,ddlhost2:1", "--", PYTHON, example, "--epochs", "1", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("replicas identical: yes", result.stdout)
        # The same DDP on torch.distributed's "ddl" backend: libddl's shared memory within a host, Gloo between.
        package = os.path.join(os.environ.get("DDL_BUILD_DIR", os.path.join(SOURCE, "build")), "python")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:2,ddlhost2:2", "--", PYTHON, example, "--epochs", "1",
                         "--backend", "ddl", timeout=300, env={"PYTHONPATH": package})
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        by_rank = lines_by_rank(result.stdout)
        self.assertIn("backend ddl", by_rank[0][0])
        self.assertIn("allreduce check: rank 3 world 4 got [10, 100] expected [10, 100] ok", by_rank[3])
        self.assertIn("replicas identical: yes", result.stdout)

    def test_a_gloo_address_that_does_not_resolve_is_an_error_naming_it_not_a_crash(self):
        # Gloo's TCP device used a failed lookup unchecked: every rank died of SIGSEGV in ddl_init.
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:1,ddlhost2:1", "--", CHECKS, "world", timeout=300,
                         env={"DDL_GLOO_ADDR": "no-such-host.invalid"})
        self.assertEqual(result.returncode, 1, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("the address this rank gives its peers for Gloo, 'no-such-host.invalid', does not resolve here",
                      result.stdout + result.stderr)
        self.assertNotIn("SIGSEGV", result.stderr)

    def test_every_host_gets_its_job_at_once_even_with_a_large_environment(self):
        # The job (environment included) travels on the remote shell's stdin. One larger than a pipe's
        # 64 KiB was written host after host, each waiting for its shell to connect and read. A remote
        # shell of the test's own, which runs the agent here: the first host's waits (10 s at most)
        # for the second host's shell to have started before it reads its job.
        second = os.path.join(self.shared, f"second-started.{self.marker}")
        rsh = write_executable(self.shared, f"rsh.{self.marker}",
                               "#!/bin/bash\nhost=$1; shift\n"
                               f"if [ \"$host\" = ddlhost2 ]; then\n"
                               f"  for i in $(seq 100); do [ -e {second} ] && break; sleep 0.1; done\n"
                               f"  [ -e {second} ] || {{ echo 'the second host had no shell yet' >&2; exit 9; }}\n"
                               f"else touch {second}; fi\n"
                               'exec bash -c "$*"\n')
        address = on_host("ddlhost1", "getent", "hosts", "ddlhost2").stdout.split()[0]  # a second name for it
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", f"ddlhost2:1,{address}:1", "--rsh", rsh, "--", "sh", "-c",
                         'echo "$RANK ${#BIG1} ${#BIG2}"', env={"BIG1": "x" * 100000, "BIG2": "y" * 100000})
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
        self.assertEqual(sorted(result.stdout.splitlines()), ["[0] 0 100000 100000", "[1] 1 100000 100000"])

    def test_hosts_with_different_slot_counts_run_every_slot_with_their_own_local_sizes(self):
        # 6 = 4 + 2 with no count; -np 3 on two 2-slot hosts fills ddlhost1 first (2 + 1), as mpirun does.
        for args, sizes in ((["-H", "ddlhost1:4,ddlhost2:2"], [4, 2]), (["-H", "ddlhost1:2,ddlhost2:2", "-np", "3"], [2, 1])):
            result = self.run_on_hosts("--cpu", *args)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            found = workers(result.stdout)
            expected, rank = {}, 0
            for node, size in enumerate(sizes):
                for local in range(size):
                    cross_size = sum(1 for s in sizes if s > local)
                    expected[rank] = {"RANK": str(rank), "WORLD_SIZE": str(sum(sizes)), "LOCAL_RANK": str(local),
                                      "LOCAL_WORLD_SIZE": str(size), "DDL_LOCAL_SIZE": str(size), "HOROVOD_LOCAL_SIZE": str(size),
                                      "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "HOROVOD_CROSS_RANK": str(node),
                                      "HOROVOD_CROSS_SIZE": str(cross_size), "host": f"ddlhost{node + 1}"}
                    rank += 1
            self.assertEqual({r: {k: w[k] for k in expected[0]} for r, w in found.items()}, expected)

    def test_libddl_and_ddl_torch_on_hosts_with_different_slot_counts(self):
        # Shared memory within each host, Gloo between: one rank on a host, and a host with more
        # ranks than the other (broadcasts from every root, allgathers, allreduces of every size).
        for hosts, sizes in (("ddlhost1:2,ddlhost2:1", [2, 1]), ("ddlhost1:4,ddlhost2:2", [4, 2])):
            result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", hosts, "--", CHECKS, "world", timeout=300)
            self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
            by_rank = lines_by_rank(result.stdout)
            firsts = [sum(sizes[:n]) for n in range(len(sizes))]
            for node, size in enumerate(sizes):
                for local in range(size):
                    rank = firsts[node] + local
                    self.assertIn(f"world rank {rank} size {sum(sizes)} local {local}/{size} node {node}", by_rank[rank])
                    self.assertTrue(any(line.startswith("PASS") for line in by_rank[rank]), by_rank[rank])
        # ddl.torch's topology as Horovod's: the smaller host first, so a cross rank is not the node rank.
        package = os.path.join(os.environ.get("DDL_BUILD_DIR", os.path.join(SOURCE, "build")), "python")
        topology = ("import ddl.torch as hvd; hvd.init(); print('topology', hvd.rank(), hvd.local_rank(), hvd.local_size(), "
                    "hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous(), flush=True); hvd.shutdown()")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:1,ddlhost2:2", "--", PYTHON, "-c", topology, timeout=300,
                         env={"PYTHONPATH": package})
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        seen = {r: lines[-1] for r, lines in lines_by_rank(result.stdout).items() if r is not None}
        self.assertEqual(seen, {0: "topology 0 0 1 0 2 False", 1: "topology 1 0 2 1 2 False", 2: "topology 2 1 2 0 1 False"})
        example = os.path.join(SOURCE, "examples", "pytorch_horovod.py")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:2,ddlhost2:1", "--", PYTHON, example, "--epochs", "1",
                         "--samples", "1536", timeout=300, env={"PYTHONPATH": package})
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("replicas identical: yes", result.stdout)

    def test_a_lightning_trainer_takes_ddl_s_ranks_across_hosts(self):
        self.assertTrue(os.access(LIGHTNING_PYTHON, os.X_OK), f"{LIGHTNING_PYTHON} is missing: run bash scripts/lightning_venv.sh")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", "ddlhost1:1,ddlhost2:1", "--", LIGHTNING_PYTHON, LIGHTNING_TRAIN,
                         timeout=480)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        reports = lightning_reports(result.stdout)
        # Lightning's global rank, world size, local rank and node rank are ddl's; the weights agree.
        self.assertEqual({r: v[:4] for r, v in reports.items()}, {0: (0, 2, 0, 0), 1: (1, 2, 0, 1)})
        self.assertEqual(len({v[4] for v in reports.values()}), 1, reports)

    def test_ranks_shows_only_the_chosen_ranks_of_every_host(self):
        result = self.run_on_hosts("--cpu", "-H", HOSTS, "--ranks", "1,3")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(sorted(workers(result.stdout)), [1, 3])
        self.assertEqual(sorted(rank for rank in lines_by_rank(result.stdout) if rank is not None), [1, 3])

    def test_prefix_host_labels_each_remote_line_with_its_host_and_rank(self):
        result = self.run_on_hosts("--cpu", "-H", HOSTS, "--prefix", "host")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        labels = {line.split("] ", 1)[0] + "]" for line in result.stdout.splitlines() if line.startswith("[")}
        self.assertEqual(labels, {f"[ddlhost{rank // 2 + 1}:{rank}]" for rank in range(4)})
        self.assertFalse([line for line in result.stdout.splitlines() if not line.startswith("[ddlhost")], result.stdout)

    def test_a_hang_across_hosts_shows_the_stacks_of_every_host_s_ranks_grouped_and_stops_the_run(self):
        # ddlhost1's ranks run under the launching ddl, ddlhost2's under its agent, which relays their stacks.
        hang_worker = os.path.join(SOURCE, "tests", "integration", "hang_worker.py")
        env = {"PYTHONPATH": os.path.join(SOURCE, "build", "python"), "DDL_TIMEOUT": "600"}
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--hang-timeout", "10", "--", PYTHON, hang_worker,
                         "barrier_skipped", env=env, timeout=180)
        self.assertEqual(result.returncode, 124, result.stdout + result.stderr)
        self.assertRegex(result.stderr, r"\nddl: ranks 0-2: in barrier \(host_ops.py:\d+\)\n")
        self.assertRegex(result.stderr, r"\nddl: rank 3: in load_batch \(hang_worker.py:\d+\)\n")
        self.assertIn("ddl: error: the run hung: nothing moved for 10 s (--hang-timeout; the stacks are above); stopped 4 worker(s)",
                      result.stderr)
        for host in ("ddlhost1", "ddlhost2"):  # each supervisor's folder went with it
            self.assertEqual(on_host(host, "sh", "-c", "ls -d /tmp/ddl-watch.* 2>/dev/null").stdout, "", host)

    def test_report_stragglers_names_the_straggler_and_its_host(self):
        straggler = os.path.join(SOURCE, "tests", "integration", "straggler_worker.py")
        result = on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--report-stragglers", "--", PYTHON, straggler, "3", "60", "0.03",
                         env={"PYTHONPATH": os.path.join(SOURCE, "build", "python")}, timeout=180)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        check_straggler_report(self, result.stderr, 3, "ddlhost2")

    def test_a_failing_worker_on_the_second_host_stops_every_host_with_its_code(self):
        result = self.run_on_hosts("--cpu", "-H", HOSTS, "--grace-period", "5", mode="fail3")
        self.assertEqual(result.returncode, 7, result.stdout + result.stderr)
        self.assertIn("ddl: error: rank 3 on ddlhost2 exited with code 7", result.stderr)
        self.assertIn("  | failing on purpose", result.stderr)
        for rank in (0, 1, 2):
            self.assertIn(f"rank {rank} on ddlhost{rank // 2 + 1} got SIGTERM", result.stdout)
        self.assert_nothing_left()

    def test_max_restarts_starts_every_host_again(self):
        result = self.run_on_hosts("--cpu", "-H", HOSTS, "--max-restarts", "1", mode="fail3once")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("rank 3 on ddlhost2 exited with code 9; restarting all workers (1 of 1 restarts)", result.stderr)
        by_restart = {}
        for rank, lines in lines_by_rank(result.stdout).items():
            for line in lines:
                if rank is not None and line.startswith("{"):
                    w = json.loads(line)
                    by_restart.setdefault(w["TORCHELASTIC_RESTART_COUNT"], set()).add((rank, w["host"]))
        self.assertEqual(by_restart["1"], {(0, "ddlhost1"), (1, "ddlhost1"), (2, "ddlhost2"), (3, "ddlhost2")})
        self.assert_nothing_left()

    def test_ctrl_c_and_sigterm_reach_every_remote_worker(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--", PYTHON, "-c", WORKER, self.marker, "wait", self.shared)
            self.wait_for_workers(4)
            os.kill(self.launching_ddl(), sig)
            out, err = launcher.communicate(timeout=60)
            self.assertEqual(launcher.returncode, 128 + sig, out + err)
            for rank in range(4):
                self.assertIn(f"rank {rank} on ddlhost{rank // 2 + 1} got {sig.name}", out)
            self.assert_nothing_left()

    def test_sigquit_shows_the_stacks_of_every_host_s_ranks_and_report_lets_the_run_go_on(self):
        # The remote host's agent is asked for its ranks' stacks; with --hang-action report the run
        # goes on, and a SIGTERM then ends it as usual.
        launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--hang-action", "report", "--", PYTHON, "-c", WORKER,
                                 self.marker, "wait", self.shared)
        self.wait_for_workers(4)
        ddl_pid = self.launching_ddl()
        os.kill(ddl_pid, signal.SIGQUIT)
        time.sleep(3)
        self.assertGreaterEqual(len([p for p in processes_with(self.marker) if comm(p) != "ddl"]), 4)  # still running
        os.kill(ddl_pid, signal.SIGTERM)
        out, err = launcher.communicate(timeout=60)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM, out + err)
        self.assertRegex(err, r"ddl: SIGQUIT: the stacks of every rank:\nddl: ranks 0-3: in <module> \(<string>:\d+\)\n")
        for rank in range(4):
            self.assertIn(f"rank {rank} on ddlhost{rank // 2 + 1} got SIGTERM", out)
        self.assert_nothing_left()

    def test_ctrl_z_stops_every_remote_worker_and_fg_resumes_them(self):
        launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--", PYTHON, "-c", WORKER, self.marker, "wait", self.shared)
        self.wait_for_workers(4)
        ddl_pid = self.launching_ddl()
        workers = [p for p in processes_with(self.marker) if comm(p).startswith("python")]
        self.assertEqual(len(workers), 4, workers)
        os.kill(ddl_pid, signal.SIGTSTP)
        self.assertTrue(wait_until(lambda: all(is_stopped(p) for p in workers + [ddl_pid]), 20),
                        f"not stopped: {[p for p in workers + [ddl_pid] if not is_stopped(p)]}")
        os.kill(ddl_pid, signal.SIGCONT)
        self.assertTrue(wait_until(lambda: not any(is_stopped(p) for p in workers + [ddl_pid]), 20),
                        f"still stopped: {[p for p in workers + [ddl_pid] if is_stopped(p)]}")
        os.kill(ddl_pid, signal.SIGINT)
        out, err = launcher.communicate(timeout=60)
        self.assertEqual(launcher.returncode, 128 + signal.SIGINT, out + err)
        for rank in range(4):
            self.assertIn(f"rank {rank} on ddlhost{rank // 2 + 1} got SIGINT", out)
        self.assert_nothing_left()

    def test_sigusr1_reaches_every_remote_worker_without_stopping_the_run(self):
        script = ('import os, signal, socket, sys, time\n'
                  'signal.signal(signal.SIGUSR1, lambda s, f: (print(f"rank {os.environ[\'RANK\']} on {socket.gethostname()} '
                  'checkpoint", flush=True), sys.exit(0)))\n'
                  'open(os.path.join(sys.argv[2], f"ready.{sys.argv[1]}.{os.environ[\'RANK\']}"), "w").close()\n'
                  'time.sleep(60)\n')
        launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--", PYTHON, "-c", script, self.marker, self.shared)
        self.wait_for_workers(4)
        os.kill(self.launching_ddl(), signal.SIGUSR1)
        out, err = launcher.communicate(timeout=60)
        self.assertEqual(launcher.returncode, 0, out + err)
        for rank in range(4):
            self.assertIn(f"rank {rank} on ddlhost{rank // 2 + 1} checkpoint", out)

    def test_a_dropped_ssh_connection_leaves_nothing_running_on_the_remote_host(self):
        launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--", PYTHON, "-c", WORKER, self.marker, "wait", self.shared)
        self.wait_for_workers(4)
        ssh = children(self.launching_ddl(), "ssh")
        self.assertEqual(len(ssh), 1)
        os.kill(ssh[0], signal.SIGKILL)
        out, err = launcher.communicate(timeout=60)
        self.assertNotEqual(launcher.returncode, 0)
        self.assertIn("ddl: error: lost ddlhost2", err)
        self.assert_nothing_left()

    def test_unfinished_lines_of_remote_workers_show_while_they_wait_and_end_once(self):
        go = os.path.join(self.shared, f"go.{self.marker}")
        self.addCleanup(lambda: os.path.exists(go) and os.remove(go))
        script = ("import os, sys, time\n"
                  "sys.stdout.write('Loading ' + os.environ['RANK'] + '...'); sys.stdout.flush()\n"
                  "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
                  "print(' done')\n")
        launcher = start_on_host("ddlhost1", DDL, "run", "--cpu", "-H", HOSTS, "--", PYTHON, "-c", script, self.marker, go)
        seen = ""
        live = lambda: all(f"[{r}] Loading {r}..." in seen for r in range(4))
        deadline = time.monotonic() + 60
        while not live() and time.monotonic() < deadline:
            if select.select([launcher.stdout], [], [], 0.5)[0]:
                seen += os.read(launcher.stdout.fileno(), 65536).decode()
        self.assertTrue(live(), f"every rank's unfinished line should show while the workers wait: {seen!r}")
        self.assertIsNone(launcher.poll(), "the workers should still be waiting")
        open(go, "w").close()
        out, err = launcher.communicate(timeout=60)
        self.assertEqual(launcher.returncode, 0, seen + out + err)
        text = {r: "" for r in range(4)}
        for line in (seen + out).splitlines():
            m = re.match(r"^\[(\d)\] ((?:Loading \1\.\.\.)?(?: done)?)$", line)
            self.assertIsNotNone(m, f"a line with more than one prefix or rank: {line!r} in {seen + out!r}")
            text[int(m[1])] += m[2]
        self.assertEqual(text, {r: f"Loading {r}... done" for r in range(4)})

    def test_bad_hosts_get_one_clear_line(self):
        cases = [
            (["-H", "ddlhost1:1,nosuchhost:1"], 2, "host nosuchhost does not resolve"),
            (["-H", "ddlhost1:1,ddlhost2:1", "--nproc-per-node", "2"], 2, "host ddlhost1 has 1 slot(s) and 2 workers per host were asked"),
            (["-H", "ddlhost1:2,ddlhost2:1", "-np", "4"], 2, "-np 4 is more than the 3 slots of the hosts"),
            (["-H", "ddlhost1:x"], 2, "-H: 'ddlhost1:x' has no whole slot count"),
            (["-H", "a;rm -rf /:1"], 2, "is not a host name"),
            (["-H", "ddlhost1:1,ddlhost2:1", "--exclude", "ddlhost1,ddlhost2"], 2,
             "--exclude ddlhost1,ddlhost2 leaves none of the hosts of -H/--hostfile (ddlhost1,ddlhost2)"),
            (["-H", "ddlhost1:1", "--exclude", "ddlhost[1-2]"], 2, "--exclude ddlhost[1-2]: a node range is read by Slurm for the nodes of a Slurm allocation only"),
            (["--exclude", "ddlhost2"], 2, "--exclude leaves hosts out of a run on several"),
            # a host that resolves but where nothing answers on the remote shell's port
            (["-H", "ddlhost1:1,ddlhost2:1", "--rsh", "ssh -p 2222"], 255, "cannot reach ddlhost2 through ssh: ssh: connect to host ddlhost2 port 2222: Connection refused"),
            # ssh that offers no key: the host refuses it
            (["-H", "ddlhost1:1,ddlhost2:1", "--rsh", "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no "
              "-o UserKnownHostsFile=/dev/null -o IdentityFile=/dev/null"], 255, "cannot reach ddlhost2 through ssh"),
        ]
        for args, code, message in cases:
            result = on_host("ddlhost1", DDL, "run", "--cpu", *args, "--", "true")
            self.assertEqual(result.returncode, code, result.stdout + result.stderr)
            errors = [line for line in result.stderr.splitlines() if line.startswith("ddl: error:")]
            self.assertEqual(len(errors), 1, result.stderr)
            self.assertIn(message, errors[0])


if __name__ == "__main__":
    unittest.main()
