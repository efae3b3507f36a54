"""`ddl jupyter` for real: a Jupyter server (Debian's jupyter-notebook) started as a batch job on
the loopback Slurm (scripts/local_slurm.sh), reached over HTTP the way the printed ssh tunnel
would reach it (Host: localhost), refused without its token, and gone after `ddl jupyter stop`."""
import os
import re
import signal
import stat
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

from ddl_testing import DDL, processes_with, slurm_env, start_local_slurm, wait_until


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(host, port, path, tunnel_port):
    """GET through the server's real address, with the Host header the ssh tunnel gives the browser."""
    request = urllib.request.Request(f"http://{host}:{port}{path}", headers={"Host": f"localhost:{tunnel_port}"})
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace"), response.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), e.headers


class Jupyter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start_local_slurm()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.env = slurm_env()
        self.env["XDG_STATE_HOME"] = os.path.join(self.tmp.name, "state")

    def tearDown(self):
        self.tmp.cleanup()

    def ddl(self, *args, timeout=180):
        return subprocess.run([DDL, *args], env=self.env, cwd=self.tmp.name, capture_output=True, text=True, timeout=timeout)

    def test_start_reach_with_the_token_only_and_stop(self):
        started = self.ddl("jupyter", "start", "--site", "slurm", "--program", "notebook", "--timeout", "120")
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        m = re.search(r"is up on (\S+):(\d+), job (\d+)\.", started.stdout)
        self.assertIsNotNone(m, started.stdout)
        host, port, job = m.group(1), int(m.group(2)), m.group(3)
        try:
            tunnel = re.search(r"^  (ssh .*)$", started.stdout, re.M).group(1)
            self.assertEqual(tunnel, f"ssh -N -L {port}:{host}:{port} {os.environ.get('USER', 'root')}@{os.uname().nodename}")
            token = re.search(rf"http://localhost:{port}/\?token=([0-9a-f]+)$", started.stdout, re.M).group(1)
            self.assertGreaterEqual(len(token) * 4, 128)

            # The token is in a mode-600 file of a mode-700 directory, and on no command line.
            sessions = os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")
            self.assertEqual(stat.S_IMODE(os.stat(sessions).st_mode), 0o700)
            for name in os.listdir(sessions):
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(sessions, name)).st_mode), 0o600, name)
            self.assertEqual(processes_with(token), [])
            servers = processes_with(f"--port={port}")
            self.assertEqual(len(servers), 1)
            script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], env=self.env, capture_output=True, text=True)
            self.assertIn("--port-retries=0", script.stdout)
            self.assertNotIn(token, script.stdout)

            status, body, _ = get(host, port, f"/tree?token={token}", port)
            self.assertEqual(status, 200)
            self.assertIn("Jupyter Notebook", body)
            self.assertIn("Files", body)  # the file browser itself, not a login or error page
            status, _, headers = get(host, port, "/tree", port)
            self.assertEqual(status, 302)
            self.assertIn("/login", headers["Location"])
            status, _, _ = get(host, port, "/api/contents", port)
            self.assertEqual(status, 403)
            status, _, _ = get(host, port, "/tree?token=" + "0" * len(token), port)
            self.assertNotEqual(status, 200)

            again = self.ddl("jupyter", "tunnel", job, "--local-port", "9999")
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertIn(f"ssh -N -L 9999:{host}:{port} ", again.stdout)
            self.assertIn(f"http://localhost:9999/?token={token}", again.stdout)
        finally:
            stopped = self.ddl("jupyter", "stop", job)
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        self.assertTrue(wait_until(lambda: not processes_with(f"--port={port}"), 30), "the server outlived ddl jupyter stop")
        self.assertTrue(wait_until(lambda: "RUNNING" not in self.ddl("status", job).stdout, 30))
        self.assertEqual(os.listdir(os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")), [])
        self.assertEqual(self.ddl("jupyter", "tunnel", job).returncode, 2)

    def test_a_server_that_cannot_start_is_reported_and_cleaned_up(self):
        result = self.ddl("jupyter", "start", "--site", "slurm", "--program", "lab", "--timeout", "120")
        # Debian 12 has no JupyterLab: the job fails, and ddl says so instead of waiting.
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertRegex(result.stderr, r"job \d+ ended before Jupyter came up \(its output: .*ddl-\d+\.out\)")
        self.assertEqual(os.listdir(os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")), [])

    def test_ctrl_c_while_waiting_cancels_the_job_and_leaves_nothing(self):
        blocker = self.ddl("submit", "--site", "slurm", "--", "sleep", "300")
        self.assertEqual(blocker.returncode, 0, blocker.stderr)
        blocker_job = blocker.stdout.split("submitted job ")[1].split()[0]
        try:
            proc = subprocess.Popen([DDL, "jupyter", "start", "--site", "slurm", "--program", "notebook", "-d", f"afterok:{blocker_job}"],
                                    env=self.env, cwd=self.tmp.name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            first = proc.stdout.readline()
            job = re.search(r"submitted job (\d+)", first).group(1)
            self.assertTrue(wait_until(lambda: "PENDING" in self.ddl("status", job).stdout, 30))
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 1, err)
            self.assertIn(f"interrupted while waiting for Jupyter of job {job}", err)
            self.assertTrue(wait_until(lambda: "CANCELLED" in self.ddl("status", job).stdout, 30), self.ddl("status", job).stdout)
            self.assertEqual(os.listdir(os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")), [])
        finally:
            self.ddl("cancel", blocker_job)

    def test_dry_run_prints_the_script_and_site_rules_apply(self):
        result = self.ddl("jupyter", "start", "--site", "perlmutter", "-A", "m1234_g", "--env", "my env", "--dry-run")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("#SBATCH --gpus-per-node=1", result.stdout)
        self.assertIn("conda activate 'my env'", result.stdout)
        self.assertIn('JUPYTER_TOKEN=$(cat "$session.token") && [ -n "$JUPYTER_TOKEN" ] || {', result.stdout)
        self.assertIn("exec jupyter lab --no-browser --ip=\"$host\"", result.stdout)
        # ddl submit's --directive and --exclude apply too (the site notes send users to --directive).
        placed = self.ddl("jupyter", "start", "--site", "perlmutter", "-A", "m1234_g", "--directive", "--begin=now+300", "--exclude",
                          "nid[001-002]", "--dry-run")
        self.assertEqual(placed.returncode, 0, placed.stderr)
        self.assertIn("#SBATCH --exclude=nid[001-002]\n", placed.stdout)
        self.assertIn("#SBATCH --begin=now+300\n", placed.stdout)
        polaris = self.ddl("jupyter", "start", "--site", "polaris", "-A", "x", "--filesystems", "home", "--directive", "-r y", "--dry-run")
        self.assertEqual(polaris.returncode, 0, polaris.stderr)
        self.assertIn("#PBS -r y\n", polaris.stdout)
        refused = self.ddl("jupyter", "start", "--site", "perlmutter", "-A", "m1234")
        self.assertEqual(refused.returncode, 2)
        self.assertIn("written <project>_g", refused.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")) and
                         os.listdir(os.path.join(self.env["XDG_STATE_HOME"], "ddl", "jupyter")))

    def test_a_cpu_partition_gets_no_gpu_by_default(self):
        # Neuron's cpu partition has no GPU: the site's 8 per node were asked of it (--gres=gpu:1).
        cpu = self.ddl("jupyter", "start", "--site", "neuron", "-p", "cpu", "--comment", "python", "--dry-run")
        self.assertEqual(cpu.returncode, 0, cpu.stderr)
        self.assertNotIn("gpu", cpu.stdout.lower().split("#!")[1].split("\n\n")[0])
        gpu = self.ddl("jupyter", "start", "--site", "neuron", "--comment", "python", "--dry-run")
        self.assertEqual(gpu.returncode, 0, gpu.stderr)
        self.assertIn("#SBATCH --gres=gpu:1", gpu.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.env["XDG_STATE_HOME"], "ddl")))  # a dry run makes no folder

    def test_flags_it_cannot_honour_are_refused_in_its_own_words(self):
        # Jupyter does not run in a container: --image would be asked of the scheduler for nothing.
        image = self.ddl("jupyter", "start", "--site", "perlmutter", "-A", "m1234_g", "--image", "docker:x", "--dry-run")
        self.assertEqual(image.returncode, 2)
        self.assertIn("ddl jupyter start has no option --image", image.stderr)
        gpus = self.ddl("jupyter", "start", "--site", "perlmutter", "-A", "m1234_g", "--gpus", "8", "--dry-run")
        self.assertEqual(gpus.returncode, 2)
        self.assertEqual(gpus.stderr.splitlines(), ["ddl: error: --gpus 8: site 'perlmutter' has 4 GPUs per node",
                                                    "hint: use --gpus 4 or fewer: the job has one node"])


if __name__ == "__main__":
    unittest.main()
