"""`ddl check-build`'s "NCCL network" section: which net plugin NCCL would load between nodes, and the
site profiles that expect one (Perlmutter, Polaris: the OFI plugin on Slingshot). No Slingshot node
and no aws-ofi-nccl exist here, so the plugins are stand-ins compiled by the test: one that loads
(exporting ncclNetPlugin_v8/_v7 and ncclCollNetPlugin_v8 whose network is "AWS Libfabric", as the
real plugin's is), one that does not (it needs a symbol no library gives: dlopen fails as it would in
NCCL), one whose network is not libfabric, and none; `fi_info` is a stand-in script printing what
`fi_info -l` prints. dlopen, the loader's search path and the site matching are the real ones."""
import os
import subprocess
import tempfile
import textwrap
import unittest

from ddl_testing import DDL

GOOD = textwrap.dedent("""
    struct net { const char* name; void* init; };
    struct net ncclNetPlugin_v8 = {"AWS Libfabric", 0};
    struct net ncclNetPlugin_v7 = {"AWS Libfabric", 0};
    struct net ncclCollNetPlugin_v8 = {"AWS Libfabric", 0};
""")
MISSING_SYMBOL = textwrap.dedent("""
    extern int fi_getinfo_from_a_libfabric_that_is_not_there(void);
    struct net { const char* name; void* init; };
    struct net ncclNetPlugin_v8 = {"AWS Libfabric", (void*)fi_getinfo_from_a_libfabric_that_is_not_there};
""")
OTHER_NETWORK = textwrap.dedent("""
    struct net { const char* name; void* init; };
    struct net ncclNetPlugin_v6 = {"IBext", 0};
""")
CRASHES = textwrap.dedent("""
    #include <stdlib.h>
    struct net { const char* name; void* init; };
    struct net ncclNetPlugin_v8 = {"AWS Libfabric", 0};
    __attribute__((constructor)) static void start(void) { abort(); }
""")
FI_INFO = "#!/bin/sh\n[ \"$1\" = -l ] || exit 2\nprintf 'cxi:\\n    version: 1.0\\ntcp:\\n    version: 116.10\\nshm:\\n    version: 200.0\\n'\n"


def compile_plugin(folder, file_name, source):
    c = os.path.join(os.path.dirname(folder), file_name + "." + os.path.basename(folder) + ".c")
    with open(c, "w") as f:
        f.write(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(folder, file_name), c], check=True)


class NcclNetwork(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ddl-nccl-net-")
        self.addCleanup(self.tmp.cleanup)
        self.folders = {}
        for name, file_name, source in (("good", "libnccl-net.so", GOOD), ("missing", "libnccl-net-ofi.so", MISSING_SYMBOL),
                                        ("other", "libnccl-net.so", OTHER_NETWORK), ("crashes", "libnccl-net.so", CRASHES)):
            folder = self.folders[name] = os.path.join(self.tmp.name, name)
            os.makedirs(folder)
            compile_plugin(folder, file_name, source)
        self.bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(self.bin)
        with open(os.path.join(self.bin, "fi_info"), "w") as f:
            f.write(FI_INFO)
        os.chmod(os.path.join(self.bin, "fi_info"), 0o755)

    def section(self, with_fi_info=True, **env):
        """The NCCL network section of check-build, in an environment with only `env` of NCCL's
        and libfabric's own, on a machine matched as Perlmutter (NERSC_HOST) unless told not to."""
        full = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "FI_", "LD_LIBRARY_PATH", "NERSC_HOST"))}
        full["NERSC_HOST"] = "perlmutter"
        if with_fi_info:
            full["PATH"] = self.bin + os.pathsep + full.get("PATH", "")
        full.update(env)
        result = subprocess.run([DDL, "check-build", "--python", "/nonexistent/python3"], env=full, capture_output=True, text=True,
                                timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout.split("NCCL network (between nodes)\n")[1].split("\n\n")[0]

    def test_a_plugin_that_loads_is_named_with_its_network_and_api_and_the_site_is_satisfied(self):
        out = self.section(LD_LIBRARY_PATH=self.folders["good"], FI_MR_CACHE_MONITOR="userfaultfd", NCCL_CROSS_NIC="1")
        plugin = os.path.join(self.folders["good"], "libnccl-net.so")
        self.assertIn(f"  [X] net plugin AWS Libfabric (libnccl-net.so ({plugin}), API v8 v7, CollNet v8)", out)
        self.assertIn(f"  [X] on LD_LIBRARY_PATH ({plugin})", out)
        self.assertIn("  [X] libfabric (providers: cxi, tcp, shm (fi_info -l))", out)
        self.assertIn("  [X] NCCL/FI settings (FI_MR_CACHE_MONITOR=userfaultfd NCCL_CROSS_NIC=1)", out)
        self.assertIn("  [X] site perlmutter expects ofi (NCCL reaches it)", out)
        self.assertNotIn("WARNING", out)

    def test_no_plugin_on_a_site_that_expects_ofi_is_a_warning_with_the_fix(self):
        out = self.section(with_fi_info=False)
        self.assertIn("  [ ] net plugin libnccl-net.so (libnccl-net.so: cannot open shared object file", out)
        self.assertIn("  [ ] libfabric (no fi_info on PATH)", out)
        self.assertIn("  [ ] NCCL/FI settings (none set)", out)
        self.assertIn("  [ ] site perlmutter expects ofi (WARNING: no NCCL net plugin loads (libnccl-net.so: cannot open shared object "
                      "file: No such file or directory), so NCCL falls back to its own TCP sockets between nodes, silently and several "
                      "times slower; fix: load NERSC's NCCL with the OFI plugin (module load nccl/2.15.5-ofi", out)

    def test_a_plugin_named_by_NCCL_NET_PLUGIN_that_misses_a_symbol_says_which(self):
        out = self.section(LD_LIBRARY_PATH=self.folders["missing"], NCCL_NET_PLUGIN="ofi")
        # NCCL's order: the name as given, then libnccl-net-<name>.so.
        self.assertIn("  [ ] net plugin ofi (ofi: cannot open shared object file", out)
        self.assertIn("  [ ] net plugin libnccl-net-ofi.so (", out)
        self.assertIn("undefined symbol: fi_getinfo_from_a_libfabric_that_is_not_there", out)
        self.assertIn("  [ ] site perlmutter expects ofi (WARNING: no NCCL net plugin loads (", out)

    def test_a_plugin_of_another_network_or_NCCL_NET_elsewhere_misses_ofi(self):
        out = self.section(LD_LIBRARY_PATH=self.folders["other"])
        self.assertIn("  [X] net plugin IBext (libnccl-net.so (", out)
        self.assertIn("serves 'IBext', not libfabric (OFI)", out)
        out = self.section(LD_LIBRARY_PATH=self.folders["good"], NCCL_NET="Socket")
        self.assertIn("WARNING: NCCL_NET=Socket makes NCCL use that network instead of its plugin's 'AWS Libfabric'", out)
        out = self.section(LD_LIBRARY_PATH=self.folders["good"], NCCL_NET_PLUGIN="none")
        self.assertIn("  [ ] net plugin (NCCL_NET_PLUGIN=none: NCCL uses its own sockets or InfiniBand)", out)
        self.assertIn("WARNING: NCCL_NET_PLUGIN=none turns NCCL's net plugins off", out)

    def test_a_plugin_that_crashes_as_it_loads_is_named_and_ddl_goes_on(self):
        # The plugin is loaded in a child process: its crash is a line of the report, not ddl's end.
        out = self.section(LD_LIBRARY_PATH=self.folders["crashes"])
        self.assertIn("  [ ] net plugin libnccl-net.so (loading it crashed (Aborted): NCCL uses its own sockets or InfiniBand)", out)
        self.assertIn("  [ ] site perlmutter expects ofi (WARNING: no NCCL net plugin loads (libnccl-net.so: loading it crashed (Aborted))", out)

    def test_a_machine_no_profile_expects_anything_of_gets_no_verdict(self):
        out = self.section(NERSC_HOST="")
        self.assertNotIn("expects", out)
        self.assertIn("  [ ] net plugin libnccl-net.so (", out)


if __name__ == "__main__":
    unittest.main()
