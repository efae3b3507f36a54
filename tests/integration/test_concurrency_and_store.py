"""Two runs at once never share a port; the store each run hosts refuses strangers and serves many."""
import os
import re
import socket
import struct
import subprocess
import unittest

from ddl_testing import DDL, PYTHON, ddl, lines_by_rank

BENCH = os.environ.get("DDL_RENDEZVOUS_BENCH",
                       os.path.join(os.path.dirname(DDL), "..", "bench", "ddl_rendezvous_bench"))


class ConcurrentRuns(unittest.TestCase):
    def test_runs_started_together_get_different_master_ports(self):
        runs = 8
        script = 'echo "$MASTER_PORT ${DDL_STORE_ADDR##*:}"; sleep 1'
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        procs = [subprocess.Popen([DDL, "run", "-np", "2", "--", "sh", "-c", script], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(runs)]
        master_ports, store_ports = [], []
        for p in procs:
            out, _ = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0)
            ranks = lines_by_rank(out)
            master, store = ranks[0][0].split()
            self.assertEqual(ranks[1][0], f"{master} {store}")  # both ranks of a run agree
            master_ports.append(master)
            store_ports.append(store)
        self.assertEqual(len(set(master_ports)), runs, master_ports)
        self.assertEqual(len(set(master_ports) | set(store_ports)), 2 * runs)


# A worker that knocks on its own run's store with a wrong token, the way a stranger would.
WRONG_TOKEN = r"""
import os, socket, struct
host, port = os.environ["DDL_STORE_ADDR"].rsplit(":", 1)
token = b"f" * 32 if os.environ["DDL_STORE_TOKEN"] != "f" * 32 else b"e" * 32
body = bytes([1]) + struct.pack("<I", len(token)) + token          # Auth with the wrong token
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(struct.pack("<I", len(body)) + body)
print("reply bytes:", len(s.recv(100)))                             # 0: closed, nothing written
"""


class Store(unittest.TestCase):
    def test_a_wrong_token_is_refused_with_nothing_written_and_logged(self):
        result = ddl("-np", "1", "--", PYTHON, "-c", WRONG_TOKEN)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(lines_by_rank(result.stdout)[0], ["reply bytes: 0"])
        self.assertEqual(result.stderr.count("rejected a connection"), 1)
        self.assertIn("wrong or missing DDL_STORE_TOKEN", result.stderr)

    def test_the_store_serves_1024_clients_at_once(self):
        result = ddl("-np", "1", "--", BENCH, "--clients", "1024", timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"\[0\] clients 1024: all done in [\d.]+ ms .*; 0 failures")


if __name__ == "__main__":
    unittest.main()
