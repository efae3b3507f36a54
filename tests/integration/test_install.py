"""After `cmake --install`, a program outside the tree builds against libddl with find_package(ddl)
and with pkg-config, and runs under `ddl run`."""
import os
import re
import subprocess
import tempfile
import unittest

from ddl_testing import ddl, lines_by_rank

BUILD_DIR = os.environ.get("DDL_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consumer")


def run(*cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.prefix = os.path.join(cls.tmp.name, "prefix")
        run("cmake", "--install", BUILD_DIR, "--prefix", cls.prefix)
        cls.libdir = os.path.join(cls.prefix, "lib")
        cls.env = dict(os.environ, LD_LIBRARY_PATH=cls.libdir, PKG_CONFIG_PATH=os.path.join(cls.libdir, "pkgconfig"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_installed_files(self):
        for path in ("bin/ddl", "include/ddl/ddl.h", "include/ddl/ddl.hpp", "lib/libddl.so", "lib/cmake/ddl/ddlConfig.cmake",
                     "lib/pkgconfig/ddl.pc"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, path)), path)

    def test_libddl_exports_its_c_api_and_nothing_of_its_insides(self):
        out = run("nm", "-D", "--defined-only", os.path.join(self.libdir, "libddl.so")).stdout
        symbols = [line.split() for line in out.splitlines()]
        functions = sorted(name for _, kind, name in symbols if kind == "T")
        with open(os.path.join(self.prefix, "include", "ddl", "ddl.h")) as f:
            declared = sorted(set(re.findall(r"DDL_API[^;(]*?\b(ddl_\w+)\s*\(", f.read())))
        self.assertTrue(declared)
        self.assertEqual(functions, declared)  # every function of ddl.h, and no other function
        # What else the table holds is libstdc++'s weak template type info, never ddl's engine,
        # Gloo or fmt.
        insides = [name for _, _, name in symbols
                   if name not in declared and re.search(r"3ddl|gloo|fmt|nlohmann|pmix", name, re.IGNORECASE)]
        self.assertEqual(insides, [])

    def test_find_package_consumer_runs_under_ddl_run(self):
        build = os.path.join(self.tmp.name, "consumer-build")
        run("cmake", "-S", CONSUMER, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}")
        run("cmake", "--build", build)
        result = ddl("-np", "3", "--", os.path.join(build, "consumer_c"), env={"LD_LIBRARY_PATH": self.libdir})
        self.assertEqual(result.returncode, 0, result.stderr)
        by_rank = lines_by_rank(result.stdout)
        self.assertEqual([by_rank[r][0] for r in range(3)], [f"rank {r} of 3: sum 3" for r in range(3)])
        result = ddl("-np", "2", "--", os.path.join(build, "consumer_cpp"), env={"LD_LIBRARY_PATH": self.libdir})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(lines_by_rank(result.stdout)[1], ["rank 1 got 42.5"])

    def test_pkg_config_consumer_runs_alone(self):
        flags = run("pkg-config", "--cflags", "--libs", "ddl", env=self.env).stdout.split()
        exe = os.path.join(self.tmp.name, "consumer_pc")
        run("cc", os.path.join(CONSUMER, "consumer.c"), "-o", exe, *flags)
        # Without LD_LIBRARY_PATH, as in a new shell: the flags' RPATH finds libddl in the prefix.
        env = {k: v for k, v in self.env.items() if not k.startswith("DDL_") and k != "LD_LIBRARY_PATH"}
        self.assertEqual(run(exe, env=env).stdout, "rank 0 of 1: sum 0\n")


if __name__ == "__main__":
    unittest.main()


class PackageWithoutItsLibrary(unittest.TestCase):
    """The Python package finds its libddl only where its own layout puts it: copied elsewhere (what
    `pip install --target` leaves: the package without the wheel's library), it loads no other
    libddl lying nearby, and says what to do."""

    def test_a_copied_package_loads_no_stray_libddl_and_says_how_to_install(self):
        import shutil
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "a", "b", "target")
            shutil.copytree(os.path.join(BUILD_DIR, "python", "ddl"), os.path.join(target, "ddl"))
            shutil.copy(os.path.join(BUILD_DIR, "runtime", "libddl.so.0"), os.path.join(tmp, "a", "libddl.so.0"))  # a stray one
            env = {k: v for k, v in os.environ.items() if k not in ("DDL_LIBRARY", "LD_LIBRARY_PATH")}
            env["PYTHONPATH"] = target
            result = subprocess.run(["/usr/bin/python3", "-c", "import ddl.torch"], capture_output=True, text=True, env=env,
                                    timeout=120)
        self.assertNotEqual(result.returncode, 0)
        last = result.stderr.strip().splitlines()[-1]
        self.assertIn("ddl: cannot load libddl: no libddl is installed with this package", last)
        self.assertNotIn(os.path.join(tmp, "a", "libddl.so.0"), last)  # never tried
