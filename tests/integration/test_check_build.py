"""`ddl check-build` against the real machine: every version it reports is checked against what the
tool itself says (torch, srun, mpirun, the build's own NCCL/PMIx), inside and outside a real Slurm
allocation (the loopback cluster), with broken and hanging Python packages, and site matching."""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

from ddl_testing import DDL, PYTHON, ddl_raw, slurm_env, start_local_slurm, write_executable

BUILD = os.environ.get("DDL_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))


def build_feature(name):
    with open(os.path.join(BUILD, "generated", "ddl", "build_features.hpp")) as f:
        return re.search(rf'#define {name} "([^"]*)"', f.read()).group(1)


class CheckBuild(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start_local_slurm()

    def check_build(self, *args, env=None, timeout=300):
        full = slurm_env()
        full.update(env or {})
        return subprocess.run([DDL, "check-build", "--python", PYTHON, *args], env=full, capture_output=True, text=True, timeout=timeout)

    def test_every_version_is_what_the_tool_itself_says(self):
        result = self.check_build()
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        torch = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
        self.assertIn(f"  [X] torch {torch} (CUDA ", out)
        self.assertIn("gloo yes", out)
        # ddl's own Python package, found beside this build's ddl (build/python), on this build's libddl.
        libddl = os.path.realpath(os.path.join(os.path.dirname(DDL), "..", "runtime", "libddl.so.0"))
        self.assertRegex(out, rf"  \[X\] ddl\.torch \d+\.\d+\.\d+ \(Horovod API on torch {re.escape(torch)}; .*; "
                              r"per-op calls compiled; libddl (.*)\)")
        loaded = re.search(r"ddl\.torch .*; libddl (.*)\)", out).group(1)
        self.assertEqual(os.path.realpath(loaded), libddl)
        srun = subprocess.run(["srun", "--version"], env=slurm_env(), capture_output=True, text=True).stdout.split()[-1]
        self.assertRegex(out, rf"  \[X\] Slurm {re.escape(srun)} \(srun --mpi: .*pmix")
        mpirun = re.search(r"(\d+\.\d+\.\d+)", subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout).group(1)
        self.assertIn(f"  [X] Open MPI {mpirun} ", out)
        ssh = re.search(r"OpenSSH_(\d+\.\d+)", subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr).group(1)
        self.assertIn(f"  [X] ssh {ssh} (ddl run -H", out)
        nccl = build_feature("DDL_BUILD_NCCL_VERSION")
        if nccl:  # loaded at run time: here /usr/local/cuda's, the same version as the header (test_nccl_loading.py)
            self.assertRegex(out, rf"  \[X\] NCCL {re.escape(nccl)} \(\S+/libnccl\.so\.2, found on the loader path .*; built with nccl\.h {re.escape(nccl)}\)")
            self.assertIn(f"  [ ] NCCL {nccl} (loads; no GPU visible)", out.split("Tensor operations")[1])
            self.assertRegex(out, rf"ddl\.torch .*NCCL {re.escape(nccl)} for CUDA tensors \(\S+/libnccl\.so\.2, loader path\)")
        else:
            self.assertIn("  [ ] NCCL (not compiled in", out)
        pmix = build_feature("DDL_BUILD_PMIX_VERSION")
        self.assertIn(f"  [X] PMIx {pmix} (compiled" if pmix else "  [ ] PMIx (not compiled in", out)
        self.assertIn("  [ ] PBS (qsub not found)", out)
        self.assertIn("  [ ] allocation (not inside a Slurm or PBS job", out)
        self.assertIn("  [X] Gloo (host buffers)", out)

    def test_json_holds_the_same_items(self):
        text = self.check_build().stdout
        doc = json.loads(self.check_build("--json").stdout)
        for section in doc["sections"]:
            self.assertIn("\n" + section["title"] + "\n", text)
            for item in section["items"]:
                name = item["name"] + (" " + item["version"] if item["version"] else "")
                self.assertIn(f"[{'X' if item['ok'] else ' '}] {name}", text)

    def test_inside_an_allocation_it_names_the_job_and_its_gpus(self):
        result = subprocess.run(["salloc", "-N1", "--gpus-per-node=2", DDL, "check-build", "--python", PYTHON], env=slurm_env(),
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"  \[X\] Slurm job \d+ \(1 node\(s\), 2 GPU\(s\) per node\)")
        result = self.check_build(env={"CUDA_VISIBLE_DEVICES": "2,3"})
        # This machine has no NVIDIA driver: the variable alone names GPUs nothing here can use.
        self.assertIn("  [ ] 2 GPU(s) (named by CUDA_VISIBLE_DEVICES, but this machine has no NVIDIA driver", result.stdout)
        self.assertNotIn("CUDA buffers, one GPU per rank", result.stdout)

    def test_missing_broken_and_hanging_python_pieces_are_lines_not_crashes(self):
        result = subprocess.run([DDL, "check-build", "--python", "/nonexistent/python3"], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("  [ ] Python (/nonexistent/python3 does not run: ", result.stdout)
        with tempfile.TemporaryDirectory() as fake:
            # A module's __version__ may be anything: a number was a JSON type error ("this is a bug").
            for name, body in (("tensorflow", "import time\ntime.sleep(600)\n"), ("horovod", "raise RuntimeError('broken build')\n"),
                               ("lightning", "__version__ = 2\n")):
                os.makedirs(os.path.join(fake, name))
                with open(os.path.join(fake, name, "__init__.py"), "w") as f:
                    f.write(body)
            start = time.monotonic()
            # 30 s: the probes run at once, and on a loaded 2-core machine five Pythons (one importing
            # the real torch) took more than 10 s to start. The hanging one must still be cut off.
            result = self.check_build("--probe-timeout", "30", env={"PYTHONPATH": fake})
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertLess(time.monotonic() - start, 110)
            self.assertIn("  [ ] tensorflow (importing it took more than 30 s; not probed further)", result.stdout)
            self.assertIn("  [ ] horovod (import failed: RuntimeError: broken build)", result.stdout)
            self.assertIn("  [X] lightning 2 (lightning)", result.stdout)

    def test_probe_timeout_bounds_a_python_that_hangs_before_anything_is_imported(self):
        with tempfile.TemporaryDirectory() as tmp:
            hanging = write_executable(tmp, "python3", "#!/bin/sh\nexec sleep 600\n")
            start = time.monotonic()
            result = subprocess.run([DDL, "check-build", "--python", hanging, "--probe-timeout", "3"], capture_output=True,
                                    text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertLess(time.monotonic() - start, 25)  # the version probe took its own 30 s
            self.assertIn(f"  [ ] Python ({hanging} does not run: ", result.stdout)

    def test_ddl_faces_name_the_framework_a_python_lacks_rather_than_say_not_installed(self):
        # In a folder with a blank in its name: the path was cut at the blank, and every probe failed.
        with tempfile.TemporaryDirectory(prefix="a venv ") as tmp:
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", tmp], check=True)  # no torch, no TensorFlow
            python = os.path.join(tmp, "bin", "python")
            result = subprocess.run([DDL, "check-build", "--python", python], capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"Frameworks ({python}, Python 3.", result.stdout)
        self.assertIn("  [ ] torch (not installed)", result.stdout)
        self.assertIn(f"  [ ] ddl.torch (installed, but needs torch, which {python} cannot import "
                      "(No module named 'torch'))", result.stdout)
        self.assertIn(f"  [ ] ddl.tensorflow (installed, but needs tensorflow, which {python} cannot import "
                      "(No module named 'tensorflow'))", result.stdout)

    def test_the_package_answers_for_its_faces_itself_as_check_build_shows_it(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
        probe = subprocess.run([PYTHON, "-m", "ddl.capabilities", "torch"], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(probe.returncode, 0, probe.stderr)
        said = json.loads(probe.stdout)
        self.assertIn(f"  [X] ddl.torch {said['version']} ({said['detail']})", self.check_build().stdout)
        usage = subprocess.run([PYTHON, "-m", "ddl.capabilities", "mxnet"], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((usage.returncode, usage.stdout), (2, ""))
        self.assertIn("usage: python -m ddl.capabilities {torch|tensorflow}", usage.stderr)

    def test_an_older_package_beside_ddl_is_named_as_such_not_as_missing(self):
        # A prefix whose ddl has beside it a package from before ddl.capabilities.
        with tempfile.TemporaryDirectory() as prefix:
            os.makedirs(os.path.join(prefix, "bin"))
            shutil.copy(DDL, os.path.join(prefix, "bin", "ddl"))
            shutil.copytree(os.path.join(BUILD, "python", "ddl"), os.path.join(prefix, "python", "ddl"),
                            ignore=shutil.ignore_patterns("capabilities.py", "__pycache__"))
            result = subprocess.run([os.path.join(prefix, "bin", "ddl"), "check-build", "--python", PYTHON],
                                    capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"  [ ] ddl.torch (an older ddl package, without ddl.capabilities: install this ddl's package for {PYTHON})",
                      result.stdout)

    def test_the_site_profile_that_matches_this_machine(self):
        self.assertIn("  [X] site perlmutter (ddl submit --site perlmutter ...)", self.check_build(env={"NERSC_HOST": "perlmutter"}).stdout)
        with tempfile.TemporaryDirectory() as config:
            os.makedirs(os.path.join(config, "ddl", "sites"))
            with open(os.path.join(config, "ddl", "sites", "thisbox.json"), "w") as f:
                json.dump({"scheduler": "slurm", "match": {"hostname": re.escape(socket.getfqdn()) + "|" + re.escape(socket.gethostname())}}, f)
            result = self.check_build(env={"XDG_CONFIG_HOME": config})
            self.assertIn("  [X] site thisbox (ddl submit --site thisbox ...)", result.stdout)
        self.assertIn("  [ ] site profile (none matches this machine", self.check_build().stdout)

    def test_sites_show_prints_the_limits_that_can_refuse_a_job_and_the_match(self):
        def shown(site):
            result = subprocess.run([DDL, "sites", "show", site], capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            return [" ".join(line.split()) for line in result.stdout.splitlines()]
        self.assertIn("queues.debug nodes 1-2, up to 01:00:00 [built-in]", shown("polaris"))
        self.assertIn("queues.prod nodes 10-496, up to 24:00:00 [built-in]", shown("polaris"))
        self.assertIn("max_cores_per_gpu 16 [built-in]", shown("alliance"))
        self.assertIn("partitions.cas_v100_2 2 GPU(s), 32 cores per node [built-in]", shown("neuron"))
        self.assertIn("match.environment.NERSC_HOST perlmutter [built-in]", shown("perlmutter"))

    def test_a_broken_site_profile_is_named_by_check_build_and_does_not_cut_the_sites_listing(self):
        with tempfile.TemporaryDirectory() as config:
            os.makedirs(os.path.join(config, "ddl", "sites"))
            broken = os.path.join(config, "ddl", "sites", "abroken.json")
            with open(broken, "w") as f:
                json.dump({"scheduler": "slurm", "gpus_per_node": "x"}, f)
            fault = f"site profile {broken}: field 'gpus_per_node' must be a whole number from 0 to 1048576"
            self.assertIn(f"  [ ] site profile abroken (broken: {fault})", self.check_build(env={"XDG_CONFIG_HOME": config}).stdout)
            listing = ddl_raw("sites", env={"XDG_CONFIG_HOME": config})
            self.assertEqual(listing.returncode, 2)
            lines = listing.stdout.splitlines()
            self.assertEqual([line.split()[0] for line in lines[:-1]],
                             ["abroken", "alliance", "neuron", "pbs", "perlmutter", "polaris", "slurm", "sockeye"])
            self.assertIn("(broken: ddl sites show abroken says why)", lines[0])
            self.assertEqual(listing.stderr.splitlines()[0], f"ddl: error: {fault}")


if __name__ == "__main__":
    unittest.main()


class CheckBuildTensorFlow(unittest.TestCase):
    """check-build with each TensorFlow venv of scripts/tf_venv.sh: TensorFlow's and Keras's versions as
    TensorFlow itself says them, and ddl.tensorflow loading from this build."""

    def test_tensorflow_keras_and_ddl_tensorflow_versions(self):
        for flavour, major in (("keras2", "2"), ("keras3", "3")):
            python = os.environ.get(f"DDL_TF_{flavour.upper()}_PYTHON", f"/var/cache/ddl/tf-{flavour}-venv/bin/python")
            with self.subTest(flavour=flavour):
                said = subprocess.run([python, "-c", "import tensorflow as tf, keras; print(tf.__version__, keras.__version__)"],
                                      capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
                self.assertEqual(said.returncode, 0, said.stderr[-2000:])
                tf_version, keras_version = said.stdout.split()
                self.assertTrue(keras_version.startswith(major + "."), keras_version)
                result = subprocess.run([DDL, "check-build", "--python", python], capture_output=True, text=True, timeout=300)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn(f"  [X] tensorflow {tf_version} (Keras {keras_version}; ", result.stdout)
                self.assertRegex(result.stdout, rf"  \[X\] ddl.tensorflow \S+ \(Horovod TensorFlow and Keras APIs on "
                                                rf"tensorflow {re.escape(tf_version)}, Keras {re.escape(keras_version)}; .*libddl "
                                                rf"{re.escape(os.path.realpath(os.path.join(BUILD, 'runtime')))}")
