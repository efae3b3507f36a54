"""ddl's third-party libraries on a site that lacks them (cmake/Dependencies.cmake): each missing one
is built from its pinned source, checked against its hash; when all are present nothing is
downloaded, and with DDL_FETCH_MISSING=OFF a missing one stops the configure with what to do.

"Missing" is made real with CMAKE_DISABLE_FIND_PACKAGE_<name>, which hides the installed package
from find_package. The pinned sources are Debian's .orig tarballs (downloaded from Debian's archive,
which this machine reaches). Gloo's fallback is pinned to a GitHub commit, which this machine cannot
reach, so its fetch is not exercised here (its pin and the patch it needs are in Dependencies.cmake)."""
import os
import shutil
import subprocess
import tempfile
import unittest

from ddl_testing import BUILD_NICENESS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HIDDEN = ("fmt", "CLI11", "nlohmann_json")


def configure(build, *defines):
    return subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DBUILD_TESTING=OFF", "-DDDL_BUILD_EXTRAS=OFF",
                           "-DDDL_WITH_NCCL=OFF", *defines], capture_output=True, text=True, timeout=900)


class DependencyFallback(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddl-deps-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_everything_present_needs_no_network(self):
        result = configure(os.path.join(self.tmp, "b"), "-DFETCHCONTENT_FULLY_DISCONNECTED=ON")
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        for name in HIDDEN + ("Gloo",):
            self.assertRegex(result.stdout, rf"-- ddl: {name} found \(/")
        self.assertNotIn("building the pinned", result.stdout)

    def test_missing_libraries_are_built_from_their_pinned_sources_and_ddl_works(self):
        build = os.path.join(self.tmp, "b")
        result = configure(build, *[f"-DCMAKE_DISABLE_FIND_PACKAGE_{name}=ON" for name in HIDDEN])
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("-- ddl: fmt not found: building the pinned https://deb.debian.org/debian/pool/main/f/fmtlib/",
                      result.stdout)
        self.assertIn("-- ddl: CLI11 not found: building the pinned ", result.stdout)
        self.assertIn("-- ddl: nlohmann_json not found: building the pinned ", result.stdout)
        built = subprocess.run([*BUILD_NICENESS.split(), "cmake", "--build", build, "-j2", "--target", "ddl"], capture_output=True, text=True,
                               timeout=1800)
        self.assertEqual(built.returncode, 0, built.stdout[-3000:] + built.stderr[-3000:])
        ddl = os.path.join(build, "cli", "ddl")
        # The fetched fmt is linked in, not the system's.
        needed = subprocess.run(["readelf", "-d", ddl], capture_output=True, text=True).stdout
        self.assertNotIn("libfmt.so", needed)
        run = subprocess.run([ddl, "run", "-np", "2", "--", "/bin/sh", "-c", "echo rank $RANK of $WORLD_SIZE"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(sorted(run.stdout.splitlines()), ["[0] rank 0 of 2", "[1] rank 1 of 2"])

    def test_a_download_that_does_not_match_its_hash_is_refused(self):
        # A mirror that serves other bytes under the pinned name must stop the configure.
        pool = os.path.join(self.tmp, "pool")
        os.makedirs(os.path.join(pool, "f", "fmtlib"))
        for name in ("fmtlib_9.1.0+ds1.orig.tar.gz", "fmtlib_9.1.0%2bds1.orig.tar.gz"):
            with open(os.path.join(pool, "f", "fmtlib", name), "wb") as f:
                f.write(b"not the pinned fmt")
        result = configure(os.path.join(self.tmp, "b"), "-DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON",
                           f"-DDDL_DEBIAN_POOL=file://{pool}")
        self.assertNotEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertRegex(result.stdout + result.stderr, r"(?i)hash mismatch|HASH mismatch|does not match")

    def test_without_fetching_a_missing_library_is_one_clear_error(self):
        result = configure(os.path.join(self.tmp, "b"), "-DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON", "-DDDL_FETCH_MISSING=OFF")
        self.assertNotEqual(result.returncode, 0)
        said = " ".join(result.stderr.split())  # CMake wraps its messages
        self.assertIn("ddl: fmt was not found and DDL_FETCH_MISSING is OFF: load its module, add its prefix to "
                      "CMAKE_PREFIX_PATH", said)


if __name__ == "__main__":
    unittest.main()
