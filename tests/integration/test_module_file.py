"""The CMake prefix + module file route, as an unprivileged user would take it: from a copy of the
checkout, configure, build and `cmake --install` into a prefix of the user's own; then a fresh login
shell that knows nothing of ddl (no PYTHONPATH, no LD_LIBRARY_PATH, nothing exported by hand) does
`module use PREFIX/share/modulefiles; module load ddl` and gets a working `ddl`, `import ddl.torch`
under `ddl run -np 2`, `ddl check-build`, pkg-config and find_package(ddl) for a C program that then
runs under `ddl run`; `module unload ddl` gives the environment back as it was. The installed binaries
carry an RPATH instead of needing LD_LIBRARY_PATH. DDL_INSTALL_MODULEFILEDIR puts the module file
into a site's own module tree."""
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import textwrap
import unittest

from ddl_testing import BUILD_NICENESS, copy_checkout, unprivileged_user

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONSUMER = os.path.join(ROOT, "tests", "integration", "consumer")
LMOD_INIT = "/etc/profile.d/lmod.sh"  # Debian's lmod package: what a login shell sources
USER = "ddl-module-test"
TRAIN = textwrap.dedent("""
    import torch, ddl, ddl.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    with open("/proc/self/maps") as f:
        libddl = sorted({line.split()[-1] for line in f if "/libddl.so" in line})
    print(hvd.rank(), hvd.size(), total.item(), ddl.__file__, ",".join(libddl), flush=True)
""")
# Lmod's own bookkeeping, which `module use` / `module unload` may leave behind: not the user's environment.
LMOD_STATE = re.compile(r"^(_ModuleTable\w*|__LMOD\w*|LMOD_\w+|_LMFILES_|LOADEDMODULES|MODULEPATH\w*)$")


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(ddl VERSION (\S+)", f.read()).group(1)


def runpath(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", out)
    return m.group(1).split(":") if m else []


def environment(dump):
    """{name: value} from `env -0` output, Lmod's bookkeeping left out."""
    pairs = (entry.split("=", 1) for entry in dump.split("\0") if "=" in entry)
    return {k: v for k, v in pairs if not LMOD_STATE.match(k)}


@unittest.skipUnless(os.path.exists(LMOD_INIT), "Lmod is not installed (scripts/setup.sh --for-tests installs lmod)")
@unittest.skipUnless(os.geteuid() == 0, "needs root to run as a throwaway unprivileged user")
class ModuleFile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.version = project_version()
        cls.user = unprivileged_user(USER)
        cls.tmp = tempfile.mkdtemp(prefix="ddl-module-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)  # also when the build below fails
        os.chmod(cls.tmp, 0o755)
        os.chown(cls.tmp, cls.user.pw_uid, cls.user.pw_gid)
        cls.source = os.path.join(cls.tmp, "ddl")
        copy_checkout(ROOT, cls.source, cls.user)
        with open(os.path.join(cls.tmp, "train.py"), "w") as f:
            f.write(TRAIN)
        os.chown(os.path.join(cls.tmp, "train.py"), cls.user.pw_uid, cls.user.pw_gid)
        cls.build = os.path.join(cls.tmp, "build")
        cls.prefix = os.path.join(cls.tmp, "sw", "ddl")
        cls.modulefile = os.path.join(cls.prefix, "share", "modulefiles", "ddl", f"{cls.version}.lua")
        # The user's own build: everything ddl needs is on this machine, so nothing may be downloaded.
        cls.login_shell(None, f"cmake -S {cls.source} -B {cls.build} -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF "
                              "-DDDL_BUILD_EXTRAS=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON >/dev/null\n"
                              f"{BUILD_NICENESS} cmake --build {cls.build} -j $(nproc) >/dev/null\n"
                              f"cmake --install {cls.build} --prefix {cls.prefix} >/dev/null\n", timeout=1500)
        with open(os.path.join(cls.build, "install_manifest.txt")) as f:
            cls.manifest = f.read().split()
        # The same build, its module file put into a site's module tree instead (an absolute
        # DDL_INSTALL_MODULEFILEDIR), installed to a second prefix.
        cls.site_tree = os.path.join(cls.tmp, "site-modulefiles")
        cls.site_prefix = os.path.join(cls.tmp, "sw", "ddl-site")
        cls.login_shell(None, f"cmake -S {cls.source} -B {cls.build} -DDDL_INSTALL_MODULEFILEDIR={cls.site_tree} >/dev/null\n"
                              f"cmake --install {cls.build} --prefix {cls.site_prefix} >/dev/null\n")

    @classmethod
    def login_shell(cls, test, script, timeout=300):
        """Runs `script` as the unprivileged user in a fresh login shell (Lmod set up by /etc/profile),
        with only what a login gives: nothing of ddl, no PYTHONPATH, no LD_LIBRARY_PATH."""
        env = {"HOME": cls.user.pw_dir, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": cls.user.pw_name,
               "LOGNAME": cls.user.pw_name, "SHELL": "/bin/bash", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = ["/usr/sbin/runuser", "-u", cls.user.pw_name, "--", "bash", "-lc", "set -eo pipefail\n" + script]
        result = subprocess.run(cmd, cwd=cls.tmp, env=env, capture_output=True, text=True, timeout=timeout)
        message = f"{script}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
        if test is None:
            assert result.returncode == 0, message
        else:
            test.assertEqual(result.returncode, 0, message)
        return result

    def as_user(self, script):
        return self.login_shell(self, script)

    def load(self, tree=None):
        return f"module use {shlex.quote(tree or os.path.join(self.prefix, 'share', 'modulefiles'))}\nmodule load ddl\n"

    def test_module_file_is_written_for_the_prefix(self):
        with open(self.modulefile) as f:
            text = f.read()
        self.assertIn(f'local prefix = [==[{self.prefix}]==]', text)
        self.assertNotRegex(text, r"@\w+@")  # every @VAR@ filled in
        self.assertNotIn("LD_LIBRARY_PATH\"", text)  # RPATH, not the loader's search path
        self.assertIn(self.modulefile, self.manifest)  # uninstallable like the rest
        self.assertEqual(os.stat(self.modulefile).st_uid, self.user.pw_uid)

    def test_installed_binaries_find_libddl_through_their_rpath(self):
        for path in ("bin/ddl", "lib/libddl.so"):
            self.assertIn("$ORIGIN/../lib", runpath(os.path.join(self.prefix, path)), path)
        # With an empty environment, the dynamic loader resolves every library of both.
        for path in ("bin/ddl", "lib/libddl.so"):
            out = subprocess.run(["ldd", os.path.join(self.prefix, path)], capture_output=True, text=True,
                                 env={"PATH": "/usr/bin:/bin"}).stdout
            self.assertNotIn("not found", out, f"{path}:\n{out}")

    def test_module_load_gives_ddl_and_ddl_torch_with_nothing_exported(self):
        run = self.as_user(
            'echo "user: $(id -un)"\n'
            'test -z "${LD_LIBRARY_PATH:-}" && test -z "${PYTHONPATH:-}" && ! command -v ddl\n'
            + self.load()
            + 'echo "which: $(command -v ddl)"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; echo "PYTHONPATH=$PYTHONPATH"\n'
            'ddl --version\n'
            'ddl run -np 2 -- python3 train.py\n')
        out = run.stdout
        self.assertIn(f"user: {self.user.pw_name}\n", out)
        self.assertNotEqual(self.user.pw_uid, 0)
        self.assertIn(f"which: {self.prefix}/bin/ddl\n", out)
        self.assertIn("LD_LIBRARY_PATH=\n", out)
        self.assertIn(f"PYTHONPATH={self.prefix}/lib/python3/dist-packages\n", out)
        self.assertIn(f"\n{self.version}\n", "\n" + out)
        package = f"{self.prefix}/lib/python3/dist-packages/ddl/__init__.py"
        libddl = f"{self.prefix}/lib/libddl.so.{self.version}"  # libddl.so.0 is a link to it
        lines = sorted(line for line in out.splitlines() if line.startswith("["))
        self.assertEqual(lines, [f"[0] 0 2 3.0 {package} {libddl}", f"[1] 1 2 3.0 {package} {libddl}"], out + run.stderr)

    def test_check_build_reports_the_module_install(self):
        report = self.as_user(self.load() + "ddl check-build").stdout
        self.assertRegex(report, rf"\[X\] ddl.torch \S+ \(Horovod API on torch .*libddl {re.escape(self.prefix)}/lib/libddl\.so\.0\)")

    def test_a_c_program_builds_against_the_module_and_runs_without_ld_library_path(self):
        build = os.path.join(self.tmp, "consumer-build")
        run = self.as_user(
            self.load()
            + "pkg-config --modversion ddl\n"
            f"cmake -S {CONSUMER} -B {build} -DCMAKE_BUILD_TYPE=Release >/dev/null\n"  # found through CMAKE_PREFIX_PATH
            f"cmake --build {build} >/dev/null\n"
            f"ddl run -np 3 -- {build}/consumer_c\n")
        self.assertEqual(run.stdout.splitlines()[0], self.version)
        lines = sorted(line for line in run.stdout.splitlines() if line.startswith("["))
        self.assertEqual(lines, [f"[{r}] rank {r} of 3: sum 3" for r in range(3)], run.stdout + run.stderr)

    def test_help_names_the_installed_docs(self):
        run = self.as_user(self.load() + "module whatis ddl 2>&1\nmodule help ddl 2>&1\n")
        docs = f"{self.prefix}/share/doc/ddl"
        self.assertIn(f"Documentation: {docs}", run.stdout)
        for name in ("README.md", "install.md", "run.md", "ddl-torch.md"):
            self.assertTrue(os.path.exists(os.path.join(docs, name)), name)
        self.assertIn("ddl run -np 2 -- python train.py", run.stdout)

    def test_unload_gives_the_environment_back(self):
        run = self.as_user("env -0 > before.env\n" + self.load() + "env -0 > loaded.env\nmodule unload ddl\nenv -0 > after.env\n")
        dumps = {}
        for name in ("before", "loaded", "after"):
            with open(os.path.join(self.tmp, f"{name}.env")) as f:
                dumps[name] = environment(f.read())
        self.assertIn(self.prefix, dumps["loaded"]["PATH"], run.stdout)
        self.assertEqual(dumps["after"], dumps["before"])

    def test_modulefiledir_puts_the_module_file_into_a_site_tree(self):
        self.assertTrue(os.path.isfile(os.path.join(self.site_tree, "ddl", f"{self.version}.lua")))
        self.assertFalse(os.path.exists(os.path.join(self.site_prefix, "share", "modulefiles")))
        run = self.as_user(self.load(self.site_tree) + 'echo "which: $(command -v ddl)"\n'
                           'python3 -c "import ddl.torch, ddl; print(\'ddl from\', ddl.__file__)"\n')
        self.assertIn(f"which: {self.site_prefix}/bin/ddl\n", run.stdout)
        self.assertIn(f"ddl from {self.site_prefix}/lib/python3/dist-packages/ddl/__init__.py\n", run.stdout)


if __name__ == "__main__":
    unittest.main()
