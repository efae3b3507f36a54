"""`pip install` of ddl into a venv by an unprivileged user, as on a cluster, from the checkout; then
`ddl run -np 2` with `import ddl.torch` and `ddl check-build` in that venv with nothing exported by
hand (no PYTHONPATH, no LD_LIBRARY_PATH). The build is offline for ddl's own dependencies
(FETCHCONTENT_FULLY_DISCONNECTED: they are all on this machine); pip itself fetches the build backend
(scikit-build-core) from PyPI, as a user's pip would.

The sdist (`pip install ddl_hpc-0.1.0.tar.gz`, the README's other route) is built from the checkout and
must hold exactly the checkout's files less what pyproject.toml's sdist.exclude names: the same
sources, so the same build. It is not compiled a second time: a whole build costs this test's machine
minutes that CI does not have."""
import os
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
import unittest

from ddl_testing import BUILD_NICENESS, copy_checkout, unprivileged_user

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
USER = "ddl-pip-test"
WORKER = textwrap.dedent("""
    import sys, torch, ddl, ddl.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    print(hvd.rank(), hvd.size(), total.item(), ddl.__file__.startswith(sys.prefix), flush=True)
""")


def sdist_files(path):
    """The files of an sdist, relative to its top folder, less the metadata the sdist adds (PKG-INFO)."""
    with tarfile.open(path) as sdist:
        names = [m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile() and "/" in m.name]
    return sorted(n for n in names if n != "PKG-INFO")


def checkout_files_for_sdist(source):
    """The files of the checkout copy at `source` that pyproject.toml's sdist.exclude keeps (its
    patterns as written there: build*/ at the top, .ci/, *.log)."""
    kept = []
    for folder, dirs, files in os.walk(source):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), source)
            top = rel.split("/", 1)[0]
            if top == ".ci" or (top.startswith("build") and "/" in rel) or name.endswith(".log"):
                continue
            kept.append(rel)
    return sorted(kept)


class PipInstall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.user = unprivileged_user(USER)
        cls.tmp = tempfile.mkdtemp(prefix="ddl-pip-")
        os.chown(cls.tmp, cls.user.pw_uid, cls.user.pw_gid)
        cls.source = os.path.join(cls.tmp, "ddl")
        copy_checkout(ROOT, cls.source, cls.user)
        subprocess.run(["chown", "-R", f"{USER}:", cls.tmp], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def as_user(self, script, timeout=1800):
        """Runs a bash script as the unprivileged user, in a login-like environment with nothing of ddl's."""
        env = {"HOME": self.user.pw_dir, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": USER}
        result = subprocess.run(["/usr/sbin/runuser", "-u", USER, "--", "bash", "-euo", "pipefail", "-c", script], cwd=self.tmp,
                                env=env, capture_output=True, text=True, timeout=timeout)
        self.assertEqual(result.returncode, 0, f"{script}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n"
                                               f"{result.stderr[-5000:]}")
        return result

    def install_and_train(self, venv, what):
        pip = (f"/usr/bin/python3 -m venv --system-site-packages {venv}\n"
               f"{BUILD_NICENESS} {venv}/bin/python -m pip install --disable-pip-version-check --no-input --quiet "
               f"--config-settings=cmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON {what}\n")
        self.as_user(pip, timeout=2700)  # the build; see integration.pip_install's TIMEOUT in tests/CMakeLists.txt
        # A login shell that knows nothing of ddl: the venv's own ddl, Python, libddl.
        with open(os.path.join(self.tmp, "worker.py"), "w") as f:
            f.write(WORKER)
        run = self.as_user(f"{venv}/bin/ddl run -np 2 -- {venv}/bin/python {self.tmp}/worker.py")
        lines = sorted(line for line in run.stdout.splitlines() if line.startswith("["))
        self.assertEqual(lines, ["[0] 0 2 3.0 True", "[1] 1 2 3.0 True"], run.stdout + run.stderr)
        for path in ("bin/ddl", "lib/libddl.so.0", "include/ddl/ddl.h", "lib/cmake/ddl/ddlConfig.cmake",
                     "lib/pkgconfig/ddl.pc"):
            self.assertTrue(os.path.exists(os.path.join(venv, path)), path)
        report = self.as_user(f"{venv}/bin/ddl check-build").stdout
        self.assertIn(f"Frameworks ({venv}/bin/python3, Python ", report)
        self.assertRegex(report, rf"\[X\] ddl.torch \S+ \(Horovod API on torch .*; per-op calls compiled; "
                                 rf"libddl {venv}/lib/libddl\.so\.0\)")

    def test_from_the_checkout_with_its_sdist_holding_the_same_sources(self):
        self.install_and_train(f"{self.tmp}/venv", self.source)
        # The sdist, built by the venv's pip-installed `build`.
        self.as_user(f"{self.tmp}/venv/bin/python -m pip install --quiet --disable-pip-version-check build\n"
                     f"{self.tmp}/venv/bin/python -m build --sdist --outdir {self.tmp}/dist {self.source}")
        sdists = [f for f in os.listdir(f"{self.tmp}/dist") if f.endswith(".tar.gz")]
        self.assertEqual(len(sdists), 1, sdists)
        self.assertTrue(sdists[0].startswith("ddl_hpc-0.1.0"), sdists)
        self.assertEqual(sdist_files(f"{self.tmp}/dist/{sdists[0]}"), checkout_files_for_sdist(self.source))

    def test_an_editable_install_is_refused_saying_what_to_do_instead(self):
        # It succeeded and still served a copy: edits in the checkout changed nothing.
        venv = f"{self.tmp}/venv-editable"
        env = {"HOME": self.user.pw_dir, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": USER}
        script = (f"/usr/bin/python3 -m venv --system-site-packages {venv} && {venv}/bin/python -m pip install "
                  f"--disable-pip-version-check --no-input --config-settings=cmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON "
                  f"-e {self.source}")
        result = subprocess.run(["/usr/sbin/runuser", "-u", USER, "--", "bash", "-c", script], cwd=self.tmp, env=env,
                                capture_output=True, text=True, timeout=1800)
        self.assertNotEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertIn("ddl has no editable install (pip install -e)", result.stdout + result.stderr)
        self.assertFalse(os.path.exists(f"{venv}/bin/ddl"))

if __name__ == "__main__":
    unittest.main()
