"""The store under attack while real workers keep using it (docs/store_security.md).

One `ddl run -np 4` of store_worker.py, which plays store rounds (add, set, barrier wait, get,
delete, a fresh connection) until told to stop. Against the same port the test then sends:
strangers holding partial auth frames and giant length prefixes (the launcher's memory per such
connection is measured), wrong tokens, a flood of idle connections larger than the launcher's
descriptor limit, slowloris clients, and clients that reset during waits, with and without the
token. The workers must finish with every answer right; the hostile connections must be closed.
"""
import json
import os
import resource
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from ddl_testing import DDL, PYTHON, lines_by_rank, log, wait_until
from store_worker import auth_frame, wait_frame

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store_worker.py")
RANKS = 4
DESCRIPTOR_LIMIT = 512      # ddl's RLIMIT_NOFILE here, so that the flood below exhausts it
FLOOD = 700                 # idle connections, more than ddl may hold
FLOOD_HOLD_S = 20           # how long the flood holds them
HELD = 200                  # strangers per memory measurement
AUTH_TIMEOUT_S = 30         # StoreServerOptions::auth_timeout
MAX_BYTES_PER_STRANGER = 64 * 1024


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_server(sock, timeout):
    """True when the server closes `sock` (EOF or reset) within `timeout` seconds, having written nothing."""
    return what_server_did(sock, timeout) == "closed"


def what_server_did(sock, timeout):
    """"closed" (EOF or reset), "answered" (wrote a byte) or "nothing" within `timeout` seconds."""
    sock.settimeout(timeout)
    try:
        return "closed" if sock.recv(1) == b"" else "answered"
    except ConnectionResetError:
        return "closed"
    except (socket.timeout, TimeoutError):
        return "nothing"


def still_open(sock):
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def reset(sock):
    """Closes with an RST instead of a FIN, as a crashed or hostile client would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def send_what_fits(sock, data):
    """Sends as much of `data` as the kernel takes without blocking; returns how much that was."""
    sock.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            sent += sock.send(data[sent:])
    except (BlockingIOError, ConnectionError):
        pass
    return sent


def percentiles(samples):
    if not samples:
        return "no samples"
    ms = sorted(s * 1000 for s in samples)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    return f"n={len(ms)} p50={pick(0.5):.2f} ms p99={pick(0.99):.2f} ms max={ms[-1]:.1f} ms"


class Attacker:
    """The hostile clients, each kind on its own thread; records what it saw."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.stop = threading.Event()
        self.seen = {"wrong tokens closed": 0, "wrong tokens answered": 0, "wrong tokens left open": 0, "giant prefixes closed": 0,
                     "bytes streamed after giant prefixes": 0, "insider waits reset": 0,
                     "stranger waits reset": 0, "errors": []}
        self.slowloris_closed_after = []
        self.threads = []

    def start(self, *kinds):
        for kind in kinds:
            t = threading.Thread(target=self.guarded, args=(kind,), daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=AUTH_TIMEOUT_S + 30)

    def guarded(self, kind):
        try:
            kind()
        except Exception as e:  # reported by the test, not lost on a thread
            self.seen["errors"].append(f"{kind.__name__}: {e!r}")

    def wrong_tokens(self):
        while not self.stop.is_set():
            with connect(self.port) as s:
                s.sendall(auth_frame("f" * 32 if self.token != "f" * 32 else "e" * 32))
                outcome = what_server_did(s, 10)
                self.seen[{"closed": "wrong tokens closed", "answered": "wrong tokens answered"}.get(outcome, "wrong tokens left open")] += 1
            time.sleep(0.01)

    def giant_prefixes(self):
        chunk = b"x" * (1 << 20)
        while not self.stop.is_set():
            for claimed in (0xFFFFFFFF, 64 << 20, 4097):
                with connect(self.port) as s:
                    s.sendall(struct.pack("<I", claimed))
                    self.seen["bytes streamed after giant prefixes"] += self.stream_until_refused(s, chunk)
                    self.seen["giant prefixes closed"] += closed_by_server(s, 10)
            time.sleep(0.05)

    def stream_until_refused(self, sock, chunk, limit=16 << 20):
        sock.settimeout(2)
        sent = 0
        try:
            while sent < limit:
                sent += sock.send(chunk)
        except (OSError, socket.timeout):
            pass
        return sent

    def slowloris(self, count=20, interval=0.5):
        """Connections that send a plausible auth frame one byte at a time, never finishing it."""
        frame_bytes = struct.pack("<I", 4096) + b"\x01" + b"s" * 4095
        socks = [(connect(self.port), time.monotonic()) for _ in range(count)]
        for sock, _ in socks:
            sock.setblocking(False)
        sent = 0
        open_socks = list(socks)
        while open_socks and sent < len(frame_bytes) - 1:
            for sock, opened in list(open_socks):
                try:
                    sock.send(frame_bytes[sent:sent + 1])
                    if sock.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    self.slowloris_closed_after.append(time.monotonic() - opened)
                    open_socks.remove((sock, opened))
                    sock.close()
            sent += 1
            time.sleep(interval)
        for sock, _ in open_socks:
            sock.close()

    def resets_during_waits(self, with_token):
        key = "insider waits reset" if with_token else "stranger waits reset"
        while not self.stop.is_set():
            s = connect(self.port)
            if with_token:
                s.sendall(auth_frame(self.token) + wait_frame(["never-set"], 10_000))
            else:
                s.sendall(auth_frame("x" * 32)[:-3] + wait_frame(["never-set"], 10_000))
            time.sleep(0.02)
            reset(s)
            self.seen[key] += 1

    def insider_resets(self):
        self.resets_during_waits(True)

    def stranger_resets(self):
        self.resets_during_waits(False)

    def flood(self, count=FLOOD, hold=FLOOD_HOLD_S):
        """Idle connections, more than the launcher may have descriptors for, held open."""
        socks = []
        for _ in range(count):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            socks.append(s)
        time.sleep(hold)
        for s in socks:
            s.close()


def limit_descriptors():
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTOR_LIMIT, DESCRIPTOR_LIMIT))


class StoreUnderAttack(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="ddl-store-attack-")
        self.out = self.dir.name
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
        self.job = subprocess.Popen([DDL, "run", "-np", str(RANKS), "--", PYTHON, WORKER, self.out], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=limit_descriptors)
        published = lambda: os.path.exists(os.path.join(self.out, "store.addr"))
        self.assertTrue(wait_until(published, 60), "rank 0 never published the store's address")
        with open(os.path.join(self.out, "store.addr")) as f:
            self.port = int(f.read().rsplit(":", 1)[1])
        with open(os.path.join(self.out, "store.token")) as f:
            self.token = f.read()

    def tearDown(self):
        if self.job.poll() is None:
            self.job.kill()
            self.job.communicate()
        self.dir.cleanup()

    def hold_strangers(self, count, first_bytes):
        """`count` connections that each send `first_bytes` and stay; returns (sockets, RSS growth per connection)."""
        before = rss_bytes(self.job.pid)
        socks = [connect(self.port) for _ in range(count)]
        for s in socks:
            send_what_fits(s, first_bytes)
        time.sleep(1.5)  # let the store read what they sent
        grown = rss_bytes(self.job.pid) - before
        return socks, max(grown, 0) / count

    def measure_memory_per_stranger(self):
        partial = struct.pack("<I", 4096) + b"\x01" + b"p" * 4094  # one byte short of the largest auth frame
        held, per_partial = self.hold_strangers(HELD, partial)
        open_partial = sum(still_open(s) for s in held)
        giant = struct.pack("<I", 1 << 20) + b"g" * (256 << 10)  # 1 MiB claimed, 256 KiB streamed
        giants, per_giant = self.hold_strangers(HELD, giant)
        log(f"store attack: memory per stranger: {per_partial / 1024:.1f} KiB holding a partial auth frame "
            f"({open_partial}/{HELD} still open), {per_giant / 1024:.1f} KiB after a 1 MiB prefix and 256 KiB "
            f"({sum(still_open(s) for s in giants)}/{HELD} still open)")
        self.assertEqual(open_partial, HELD, "a stranger that is still sending its auth frame was closed early")
        self.assertLessEqual(per_partial, MAX_BYTES_PER_STRANGER)
        self.assertLessEqual(per_giant, MAX_BYTES_PER_STRANGER)
        return held + giants

    def worker_latencies(self, start, end):
        by_op = {}
        for rank in range(RANKS):
            with open(os.path.join(self.out, f"latency.{rank}.json")) as f:
                for t, took, op in json.load(f):
                    if start <= t < end:
                        by_op.setdefault(op, []).append(took)
        return by_op

    def wait_until_closed(self, strangers, opened):
        """Seconds until the server closed every one of `strangers` (opened at `opened`), or None."""
        closed = lambda: not any(still_open(s) for s in strangers)
        if not wait_until(closed, AUTH_TIMEOUT_S + 15, interval=0.5):
            return None
        for s in strangers:
            s.close()
        return time.monotonic() - opened

    def test_workers_finish_right_while_the_store_is_attacked(self):
        baseline_start = time.monotonic()
        time.sleep(3)  # the workers alone
        attack_start = time.monotonic()
        strangers = self.measure_memory_per_stranger()
        attacker = Attacker(self.port, self.token)
        attacker.start(attacker.slowloris, attacker.wrong_tokens, attacker.giant_prefixes,
                       attacker.insider_resets, attacker.stranger_resets)
        strangers_closed_after = self.wait_until_closed(strangers, attack_start)
        self.assertIsNotNone(strangers_closed_after, "silent strangers still open long after the auth timeout")
        attacker.threads[0].join(timeout=AUTH_TIMEOUT_S + 15)  # slowloris ends when all its clients are closed
        flood_start = time.monotonic()
        attacker.flood()  # while the other attacks go on
        flood_end = time.monotonic()
        attacker.finish()
        open(os.path.join(self.out, "stop"), "w").close()
        out, err = self.job.communicate(timeout=120)

        log(f"store attack: strangers holding partial frames closed {strangers_closed_after:.1f} s after they connected")
        log(f"store attack: slowloris clients closed after {sorted(round(t, 1) for t in attacker.slowloris_closed_after)} s")
        log(f"store attack: attacker saw {attacker.seen}")
        self.assertEqual(self.job.returncode, 0, out[-3000:] + err[-3000:])
        ranks = lines_by_rank(out)
        for rank in range(RANKS):
            self.assertRegex(ranks[rank][-1], rf"^rank {rank}: \d+ rounds ok$", ranks[rank])
        self.assertEqual(attacker.seen["errors"], [])
        self.assertGreater(attacker.seen["wrong tokens closed"], 0)
        self.assertEqual(attacker.seen["wrong tokens answered"], 0)
        self.assertLess(attacker.seen["bytes streamed after giant prefixes"] / max(1, attacker.seen["giant prefixes closed"]), 16 << 20)
        self.assertGreater(attacker.seen["insider waits reset"], 0)
        self.assertEqual(len(attacker.slowloris_closed_after), 20, "slowloris clients were left open")
        self.assertIn("rejected a connection", err)
        self.assertIn("out of file descriptors", err, "the flood did not reach ddl's descriptor limit")

        baseline = self.worker_latencies(baseline_start, attack_start)
        attacked = self.worker_latencies(attack_start, flood_start)
        flooded = self.worker_latencies(flood_start, flood_end)
        for op in ("wait", "get", "set", "connect"):
            log(f"store attack: worker {op:8} alone: {percentiles(baseline.get(op, []))}")
            log(f"store attack: worker {op:8} attacked: {percentiles(attacked.get(op, []))}")
            log(f"store attack: worker {op:8} flooded: {percentiles(flooded.get(op, []))}")
        self.assertTrue(attacked.get("connect") and flooded.get("connect"), "the workers made no store calls during the attack")
        # Generous: a late joiner must not wait for the flood to end to get a descriptor.
        self.assertLess(max(flooded["connect"]), FLOOD_HOLD_S / 2)

if __name__ == "__main__":
    unittest.main()
