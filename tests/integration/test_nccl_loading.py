"""libddl loads NCCL at run time, not at link time: with the real libnccl.so.2 of this machine, the
loader takes DDL_NCCL_LIBRARY first (a bad one is a clear error, not a fallback), then an NCCL
already in the process (torch's), then libnccl.so.2 on the loader's path (LD_LIBRARY_PATH); with no
NCCL anywhere (hidden in a private mount namespace) CUDA ops fail with what to set or load while host
ops work; libddl has no DT_NEEDED on libnccl; `ddl check-build` names the NCCL, its version and
where it came from. No GPU is needed: ncclGetVersion runs without one."""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

from ddl_testing import DDL, PYTHON, ddl_raw, lines_by_rank

BUILD = os.environ.get("DDL_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
LIBDDL = os.path.realpath(os.path.join(os.path.dirname(DDL), "..", "runtime", "libddl.so.0"))
NCCL = "/usr/local/cuda/lib64/libnccl.so.2"
GPU_CHECKS = os.environ.get("DDL_GPU_CHECKS", "")
UNSUPPORTED = 8  # DDL_ERROR_UNSUPPORTED


def build_feature(name):
    with open(os.path.join(BUILD, "generated", "ddl", "build_features.hpp")) as f:
        return re.search(rf'#define {name} "([^"]*)"', f.read()).group(1)


# Loads libddl (after the libraries named in argv[2:]) in a fresh Python, prints what it says of its
# NCCL; with PROBE_OPS=1 also runs a CUDA allreduce and a host allreduce in a one-process world.
PROBE = r"""
import ctypes, json, os, sys
for first in sys.argv[2:]:
    ctypes.CDLL(first, mode=ctypes.RTLD_LOCAL)
lib = ctypes.CDLL(sys.argv[1])
for name in ("ddl_nccl_version", "ddl_nccl_path", "ddl_nccl_origin", "ddl_nccl_error", "ddl_last_error"):
    getattr(lib, name).restype = ctypes.c_char_p
said = {k: getattr(lib, "ddl_nccl_" + k)().decode() for k in ("version", "path", "origin", "error")}
if os.environ.get("PROBE_OPS"):
    assert lib.ddl_init() == 0, lib.ddl_last_error()
    x = ctypes.c_float(1.0)
    h = ctypes.c_void_p()
    s = lib.ddl_allreduce_cuda_async(b"gpu.sum", ctypes.byref(x), ctypes.byref(x), ctypes.c_size_t(1), 2, 0, None, ctypes.byref(h))
    if s == 0:
        s = lib.ddl_wait(h)
    said["cuda_status"], said["cuda_error"] = s, lib.ddl_last_error().decode()
    y = ctypes.c_float(3.0)
    said["host_status"] = lib.ddl_allreduce(b"host.sum", ctypes.byref(y), ctypes.byref(y), ctypes.c_size_t(1), 2, 0)
    said["host_value"] = y.value
    lib.ddl_finalize()
with open("/proc/self/maps") as maps:
    said["nccls_mapped"] = sorted({line.split()[-1] for line in maps if "libnccl" in line.rsplit("/", 1)[-1]})
print(json.dumps(said))
"""


def clean_env(**extra):
    """This environment without ddl's variables (a one-process world) and without NCCL settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "SLURM_", "PBS_")) and k != "LD_LIBRARY_PATH"}
    env.update(extra)
    return env


def probe(*preload, env=None, ops=False, wrap=None):
    env = dict(env if env is not None else clean_env())
    if ops:
        env["PROBE_OPS"] = "1"
    command = [PYTHON, "-c", PROBE, LIBDDL, *preload]
    result = subprocess.run(wrap(command) if wrap else command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def dirs_holding_nccl():
    """Every folder the loader could find a libnccl.so* in: ld.so.cache's, the CUDA toolkit's."""
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    paths = re.findall(r"libnccl\S*\s.*=> (\S+)", cache) + glob.glob("/usr/local/cuda*/lib*/libnccl.so*")
    return sorted({os.path.dirname(os.path.realpath(p)) for p in paths if os.path.exists(p)})


def without_any_nccl(command):
    """`command` in a private mount namespace in which every folder holding a libnccl.so* is
    replaced by one with everything else in it (links into a second mount of the original)."""
    script = ["set -e", "work=$(mktemp -d)"]
    for i, folder in enumerate(dirs_holding_nccl()):
        q = shlex.quote(folder)
        script += [f"mkdir -p $work/orig{i} $work/view{i}", f"mount --bind {q} $work/orig{i}",
                   f"for f in $work/orig{i}/* $work/orig{i}/.[!.]*; do case ${{f##*/}} in libnccl*|'.[!.]*') ;; "
                   f"*) ln -s \"$f\" $work/view{i}/ ;; esac; done",
                   f"mount --bind $work/view{i} {q}"]
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "sh", *command]


@unittest.skipUnless(build_feature("DDL_BUILD_NCCL_VERSION"), "libddl was built without NCCL")
@unittest.skipUnless(os.path.exists(NCCL), f"no {NCCL} on this machine")
class NcclLoading(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.version = probe(env=clean_env(DDL_NCCL_LIBRARY=NCCL))["version"]
        # Links to the real library under other names, so that which one was loaded shows in its path.
        cls.links = {}
        for name in ("override", "ldpath", "torch"):
            os.mkdir(os.path.join(cls.tmp.name, name))
            cls.links[name] = os.path.join(cls.tmp.name, name, "libnccl.so.2")
            os.symlink(os.path.realpath(NCCL), cls.links[name])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_libddl_has_no_link_time_dependency_on_nccl(self):
        dynamic = subprocess.run(["readelf", "-d", LIBDDL], capture_output=True, text=True, check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
        self.assertTrue(needed, dynamic)
        self.assertFalse([n for n in needed if "nccl" in n], needed)
        self.assertIn("libcudart.so.13", " ".join(needed))  # the CUDA runtime stays linked

    def test_the_version_is_what_ncclGetVersion_of_the_real_library_says(self):
        code = ctypes_nccl_version_code(NCCL)
        major, minor, patch = code // 10000, code % 10000 // 100, code % 100
        self.assertEqual(self.version, f"{major}.{minor}.{patch}")
        # The header it was built with is this machine's NCCL too.
        self.assertEqual(build_feature("DDL_BUILD_NCCL_VERSION"), self.version)

    def test_override_variable_comes_before_the_loader_path(self):
        said = probe(env=clean_env(DDL_NCCL_LIBRARY=self.links["override"], LD_LIBRARY_PATH=os.path.dirname(self.links["ldpath"])))
        self.assertEqual((said["origin"], said["path"], said["version"], said["error"]), ("DDL_NCCL_LIBRARY", self.links["override"], self.version, ""))

    def test_override_variable_comes_before_an_nccl_already_loaded(self):
        # A copy, not a link: the loader shares one file however it is named (next test).
        copy = os.path.join(self.tmp.name, "copy", "libnccl.so.2")
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copyfile(NCCL, copy)
        try:
            said = probe(self.links["torch"], env=clean_env(DDL_NCCL_LIBRARY=copy))
        finally:
            os.unlink(copy)
        self.assertEqual((said["origin"], said["path"], said["version"]), ("DDL_NCCL_LIBRARY", copy, self.version))
        self.assertEqual(len(said["nccls_mapped"]), 2, said)  # what the override asked for: docs/libddl.md says so

    def test_an_override_naming_the_file_already_loaded_shares_it(self):
        said = probe(self.links["torch"], env=clean_env(DDL_NCCL_LIBRARY=self.links["override"]))
        self.assertEqual((said["origin"], said["path"]), ("DDL_NCCL_LIBRARY", self.links["torch"]))
        self.assertEqual(said["nccls_mapped"], [os.path.realpath(NCCL)])

    def test_an_nccl_already_in_the_process_comes_before_the_loader_path(self):
        said = probe(self.links["torch"], env=clean_env(LD_LIBRARY_PATH=os.path.dirname(self.links["ldpath"])))
        self.assertEqual((said["origin"], said["path"], said["version"]), ("already loaded", self.links["torch"], self.version))
        self.assertEqual(said["nccls_mapped"], [os.path.realpath(NCCL)])  # one NCCL in the process

    def test_the_loader_path_finds_libnccl_through_LD_LIBRARY_PATH(self):
        said = probe(env=clean_env(LD_LIBRARY_PATH=os.path.dirname(self.links["ldpath"])))
        self.assertEqual((said["origin"], said["path"], said["version"], said["error"]), ("loader path", self.links["ldpath"], self.version, ""))

    def test_without_settings_the_system_libnccl_is_found_on_the_loader_path(self):
        said = probe()
        self.assertEqual(said["origin"], "loader path")
        self.assertEqual(os.path.realpath(said["path"]), os.path.realpath(NCCL))

    def test_an_override_that_does_not_load_is_an_error_naming_the_variable_not_a_fallback(self):
        missing = os.path.join(self.tmp.name, "nowhere", "libnccl.so.2")
        said = probe(env=clean_env(DDL_NCCL_LIBRARY=missing), ops=True)
        self.assertEqual((said["version"], said["path"], said["origin"]), ("", "", ""))
        self.assertIn(f"DDL_NCCL_LIBRARY={missing} cannot be loaded", said["error"])
        self.assertEqual(said["cuda_status"], UNSUPPORTED)
        self.assertIn(f"op 'gpu.sum': DDL_NCCL_LIBRARY={missing} cannot be loaded", said["cuda_error"])
        self.assertEqual((said["host_status"], said["host_value"]), (0, 3.0))
        self.assertEqual(said["nccls_mapped"], [])

    def test_an_override_that_is_not_nccl_is_refused(self):
        said = probe(env=clean_env(DDL_NCCL_LIBRARY=LIBDDL))
        self.assertEqual(said["version"], "")
        self.assertIn(f"DDL_NCCL_LIBRARY={LIBDDL} is not an NCCL libddl can use: it has no ncclGetVersion", said["error"])

    def test_with_no_nccl_anywhere_cuda_ops_say_what_to_do_and_host_ops_work(self):
        if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
            self.skipTest("unshare --mount is not permitted here (needs root or user namespaces)")
        said = probe(env=clean_env(), ops=True, wrap=without_any_nccl)
        self.assertEqual((said["version"], said["path"], said["origin"]), ("", "", ""))
        self.assertIn("no NCCL could be loaded (libnccl.so.2: cannot open shared object file", said["error"])
        for advice in ("DDL_NCCL_LIBRARY", "module load nccl", "LD_LIBRARY_PATH", "torch"):
            self.assertIn(advice, said["cuda_error"])
        self.assertEqual(said["cuda_status"], UNSUPPORTED)
        self.assertTrue(said["cuda_error"].startswith("op 'gpu.sum': no NCCL could be loaded"), said["cuda_error"])
        self.assertEqual((said["host_status"], said["host_value"]), (0, 3.0))
        # The same on two ranks under ddl run, and ddl check-build says so.
        if GPU_CHECKS:
            result = subprocess.run(without_any_nccl([DDL, "run", "-np", "2", "--", GPU_CHECKS, "no-gpu"]), env=clean_env(),
                                    capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            for lines in lines_by_rank(result.stdout).values():
                self.assertTrue(lines[0].startswith("cuda op without a GPU: unsupported: op 'gpu.sum': no NCCL could be loaded"), lines[0])
        report = subprocess.run(without_any_nccl([DDL, "check-build", "--python", "/nonexistent/python3"]), env=clean_env(),
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(report.returncode, 0, report.stderr)
        header = build_feature("DDL_BUILD_NCCL_VERSION")
        self.assertIn(f"  [ ] NCCL (built with nccl.h {header}; none loads: no NCCL could be loaded (libnccl.so.2: ", report.stdout)
        tensor_ops = report.stdout.split("Tensor operations")[1]
        self.assertIn("  [ ] NCCL (none loads: CUDA buffers go through host memory (slower))", tensor_ops)
        self.assertIn("  [ ] CUDA via host (no GPU visible; CUDA buffers through host memory", tensor_ops)

    def test_only_nccl_h_is_needed_to_build_and_a_pip_wheel_s_is_found(self):
        """CMake with /usr/local/cuda's nccl.h hidden: found in a venv's nvidia/nccl/include (the
        layout of pip's nvidia-nccl-cu* wheels), or the backend is off (AUTO) / the configure stops (ON)."""
        if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
            self.skipTest("unshare --mount is not permitted here (needs root or user namespaces)")
        source = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
        venv = os.path.join(self.tmp.name, "venv")
        wheel_include = os.path.join(venv, "lib", "python3.11", "site-packages", "nvidia", "nccl", "include")
        os.makedirs(wheel_include, exist_ok=True)
        shutil.copy(os.path.join(os.path.dirname(os.path.realpath(NCCL)), "..", "include", "nccl.h"), wheel_include)
        include = os.path.realpath("/usr/local/cuda/include")
        hide = ("set -e\nwork=$(mktemp -d)\nmkdir $work/orig $work/view\n"
                f"mount --bind {include} $work/orig\n"
                "for f in $work/orig/*; do case ${f##*/} in nccl.h) ;; *) ln -s \"$f\" $work/view/ ;; esac; done\n"
                f"mount --bind $work/view {include}\n"
                'exec "$@"')

        def configure(*options, **env):
            build = tempfile.mkdtemp(dir=self.tmp.name)
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh", "cmake", "-S", source, "-B", build,
                       "-DDDL_BUILD_EXTRAS=OFF", "-DBUILD_TESTING=OFF", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON", *options]
            full = {k: v for k, v in clean_env().items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "CPATH", "NCCL_ROOT", "NCCL_HOME")}
            full.update(env)
            return subprocess.run(command, env=full, capture_output=True, text=True, timeout=300)

        found = configure(VIRTUAL_ENV=venv)
        self.assertEqual(found.returncode, 0, found.stdout + found.stderr)
        self.assertIn(f"ddl: NCCL backend (nccl.h {self.version} in {wheel_include}; libnccl.so.2 loaded at run time", found.stdout)
        self.assertIn(f"ddl: NCCL backend (nccl.h {self.version} in {wheel_include};",
                      configure(f"-DNCCL_INCLUDE_DIR={wheel_include}").stdout)
        off = configure()
        self.assertEqual(off.returncode, 0, off.stdout + off.stderr)
        self.assertIn("ddl: NCCL backend off (no CUDA toolkit with nccl.h found)", off.stdout)
        required = configure("-DDDL_WITH_NCCL=ON")
        self.assertNotEqual(required.returncode, 0)
        self.assertIn("DDL_WITH_NCCL=ON but the CUDA toolkit or nccl.h was not found", required.stderr)

    def check_build(self, **env):
        result = ddl_raw("check-build", "--python", "/nonexistent/python3", env={"LD_LIBRARY_PATH": None, **env}, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def test_check_build_names_the_nccl_its_version_and_where_it_came_from(self):
        header = build_feature("DDL_BUILD_NCCL_VERSION")
        out = self.check_build()
        found = re.search(rf"  \[X\] NCCL {re.escape(self.version)} \((.*), found on the loader path \(LD_LIBRARY_PATH, ld.so.cache\); "
                          rf"built with nccl.h {re.escape(header)}\)", out)
        self.assertTrue(found, out)
        self.assertEqual(os.path.realpath(found.group(1)), os.path.realpath(NCCL))
        self.assertIn(f"  [ ] NCCL {self.version} (loads; no GPU visible)", out.split("Tensor operations")[1])

        out = self.check_build(DDL_NCCL_LIBRARY=self.links["override"])
        self.assertIn(f"  [X] NCCL {self.version} ({self.links['override']}, named by DDL_NCCL_LIBRARY; built with nccl.h {header})", out)

        out = self.check_build(LD_LIBRARY_PATH=os.path.dirname(self.links["ldpath"]))
        self.assertIn(f"  [X] NCCL {self.version} ({self.links['ldpath']}, found on the loader path", out)

        missing = os.path.join(self.tmp.name, "nowhere", "libnccl.so.2")
        out = self.check_build(DDL_NCCL_LIBRARY=missing)
        self.assertIn(f"  [ ] NCCL (built with nccl.h {header}; none loads: DDL_NCCL_LIBRARY={missing} cannot be loaded", out)

        # JSON carries the same.
        report = json.loads(ddl_raw("check-build", "--json", "--python", "/nonexistent/python3", env={"LD_LIBRARY_PATH": None}).stdout)
        build = next(s for s in report["sections"] if s["title"] == "Build")
        nccl = next(i for i in build["items"] if i["name"] == "NCCL")
        self.assertEqual((nccl["ok"], nccl["version"]), (True, self.version))


def ctypes_nccl_version_code(path):
    code = subprocess.run([PYTHON, "-c", "import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nv = ctypes.c_int()\n"
                           "assert lib.ncclGetVersion(ctypes.byref(v)) == 0\nprint(v.value)", path],
                          capture_output=True, text=True, check=True).stdout
    return int(code)


if __name__ == "__main__":
    unittest.main()
