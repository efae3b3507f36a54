"""`ddl run --preflight` on this machine: every worker's place probes its GPU (through the CUDA
driver) and libddl before the program. No GPU and no CUDA driver exist here, so the driver is a
stand-in compiled by the test (libcuda.so.1 on LD_LIBRARY_PATH) whose cuInit returns what
STANDIN_CUINIT says: 0, or CUDA_ERROR_NO_DEVICE (100) as a node whose GPU is gone would; dlopen, the
probe's calls, the launch and the verdicts are the real ones. Several hosts: test_hosts.py and
test_two_node_slurm.py."""
import os
import subprocess
import tempfile
import textwrap
import unittest

from ddl_testing import DDL

STANDIN_DRIVER = textwrap.dedent("""
    #include <stdlib.h>
    #include <string.h>
    static char memory[1 << 20];
    int cuInit(unsigned flags) { const char* r = getenv("STANDIN_CUINIT"); return r ? atoi(r) : 0; }
    int cuDeviceGetCount(int* count) { *count = 1; return 0; }
    int cuDeviceGet(int* device, int ordinal) { *device = ordinal; return 0; }
    int cuDevicePrimaryCtxRetain(void** context, int device) { *context = memory; return 0; }
    int cuCtxSetCurrent(void* context) { return 0; }
    int cuMemAlloc_v2(unsigned long long* pointer, size_t bytes) { *pointer = (unsigned long long)memory; return 0; }
    int cuMemsetD8_v2(unsigned long long pointer, unsigned char value, size_t bytes) { memset((void*)pointer, value, bytes); return 0; }
    int cuCtxSynchronize(void) { return 0; }
    int cuMemFree_v2(unsigned long long pointer) { return 0; }
    int cuGetErrorName(int result, const char** name) { *name = result == 100 ? "CUDA_ERROR_NO_DEVICE" : 0; return 0; }
""")


class Preflight(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ddl-preflight-test-")
        self.addCleanup(self.tmp.cleanup)
        source = os.path.join(self.tmp.name, "libcuda.c")
        with open(source, "w") as f:
            f.write(STANDIN_DRIVER)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(self.tmp.name, "libcuda.so.1"), source], check=True)
        self.ran = os.path.join(self.tmp.name, "ran")

    def ddl_run(self, *args, cuinit=None, gpus=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "CUDA_", "DDL_"))}
        env["LD_LIBRARY_PATH"] = self.tmp.name
        if cuinit is not None:
            env["STANDIN_CUINIT"] = str(cuinit)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        return subprocess.run([DDL, "run", *args, "--", "sh", "-c", f'echo "$RANK $CUDA_VISIBLE_DEVICES" >> {self.ran}; echo ran'],
                              env=env, capture_output=True, text=True, timeout=180)

    def test_every_probe_passing_lets_the_program_run(self):
        result = self.ddl_run("-np", "2", "--cpu", "--preflight")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("ddl: preflight: 2 rank(s) on 1 host(s) passed\n", result.stderr)
        self.assertEqual(sorted(result.stdout.splitlines()), ["[0] ran", "[1] ran"])  # no probe line on the terminal
        result = self.ddl_run("-np", "2", "--preflight", gpus="0,1", cuinit=0)  # GPU workers on the stand-in driver
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("ddl: preflight: 2 rank(s) on 1 host(s) passed\n", result.stderr)
        with open(self.ran) as f:
            self.assertEqual(sorted(f.read().split("\n")), ["", "0 ", "0 0", "1 ", "1 1"])

    def test_a_gpu_that_fails_its_probe_stops_the_run_before_the_program_naming_the_host_and_call(self):
        result = self.ddl_run("-np", "2", "--preflight", gpus="0,1", cuinit=100)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("ddl: error:")]
        self.assertEqual(len(errors), 1, result.stderr)
        self.assertRegex(errors[0], r"^ddl: error: preflight: 1 host\(s\) failed, so the program was not started: \S+ "
                                    r"\(GPU [01]: cuInit returned CUDA_ERROR_NO_DEVICE\)$")
        self.assertIn("hint: fix what it names, or run on other nodes", result.stderr)
        self.assertFalse(os.path.exists(self.ran), "the program ran")
        # One host alone: nothing to leave out, so exclude stops the run the same way.
        result = self.ddl_run("-np", "2", "--preflight", "exclude", gpus="0,1", cuinit=100)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("cuInit returned CUDA_ERROR_NO_DEVICE", result.stderr)
        self.assertFalse(os.path.exists(self.ran), "the program ran")
        # CPU workers have no GPU to probe, whatever CUDA_VISIBLE_DEVICES they inherit.
        result = self.ddl_run("-np", "1", "--cpu", "--preflight", gpus="0", cuinit=100)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_exclude_leaves_out_a_host_whose_ssh_refuses_at_once(self):
        # An ssh that fails at once (a key refused) must not stop this host's probe before its
        # verdict: the run then found no host good and stopped. (This host needs no ssh.)
        refusing = os.path.join(self.tmp.name, "ssh")
        with open(refusing, "w") as f:
            f.write("#!/bin/sh\necho 'alice@node2: Permission denied (publickey).' >&2\nexit 255\n")
        os.chmod(refusing, 0o755)
        for attempt in range(3):  # it was a race, lost most times
            result = self.ddl_run("--cpu", "-H", "localhost:1,192.0.2.77:1", "-N", "1", "--rsh", refusing, "--preflight", "exclude")
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn("ddl: preflight: leaving out 1 host(s) that failed: 192.0.2.77 (cannot reach 192.0.2.77", result.stderr)
            self.assertEqual(result.stdout, "[0] ran\n")

    def test_a_mode_that_is_not_one_is_a_usage_error(self):
        result = self.ddl_run("-np", "1", "--cpu", "--preflight", "sometimes")
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertIn("ddl: error: --preflight sometimes: not a preflight mode", result.stderr)
        self.assertFalse(os.path.exists(self.ran))


if __name__ == "__main__":
    unittest.main()
