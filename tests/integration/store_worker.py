"""A worker that keeps using `ddl run`'s store through its wire protocol (store_protocol.hpp), and
the protocol helpers the attack test shares with it.

Run as `store_worker.py OUT_DIR` under `ddl run -np N`. Rank 0 publishes the store's address and
token under OUT_DIR (so a test can attack that very store). Every rank then plays rounds until
OUT_DIR/stop exists: atomic add, set its key, wait for every rank's key (a barrier), read its
neighbour's key, delete its key of two rounds ago, and open one fresh connection (as a late joiner
would). It checks every answer, writes the latency of each operation to OUT_DIR/latency.RANK.json
and prints "rank R: N rounds ok" or what was wrong.
"""
import json
import os
import socket
import struct
import sys
import time

AUTH, SET, GET, ADD, WAIT, DELETE = 1, 2, 3, 4, 5, 6
OK, NOT_FOUND, TIMEOUT = 0, 1, 2


def string(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<I", len(b)) + b


def frame(op, *fields):
    body = bytes([op]) + b"".join(fields)
    return struct.pack("<I", len(body)) + body


def auth_frame(token):
    return frame(AUTH, string(token))


def wait_frame(keys, timeout_ms):
    return frame(WAIT, struct.pack("<I", len(keys)), *(string(k) for k in keys), struct.pack("<q", timeout_ms))


class Store:
    """One authenticated connection; each call returns (status, rest of the reply body)."""

    def __init__(self, host, port, token, timeout=120):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        status, _ = self.call(auth_frame(token))
        if status != OK:
            raise RuntimeError(f"authentication answered {status}")

    def call(self, request):
        self.sock.sendall(request)
        length = struct.unpack("<I", self.recv_exact(4))[0]
        body = self.recv_exact(length)
        return body[0], body[1:]

    def recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("the store closed the connection")
            data += chunk
        return data

    def set(self, key, value):
        return self.call(frame(SET, string(key), string(value)))[0]

    def get(self, key):
        status, rest = self.call(frame(GET, string(key)))
        return rest[4:].decode() if status == OK else None

    def add(self, key, delta):
        status, rest = self.call(frame(ADD, string(key), struct.pack("<q", delta)))
        return struct.unpack("<q", rest)[0] if status == OK else None

    def wait(self, keys, timeout_ms):
        return self.call(wait_frame(keys, timeout_ms))[0]

    def delete(self, key):
        return self.call(frame(DELETE, string(key)))[0]

    def close(self):
        self.sock.close()


def publish(out_dir, name, text):
    tmp = os.path.join(out_dir, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out_dir, name))


class Timer:
    """Records how long each operation took, stamped with the monotonic clock the test also reads."""

    def __init__(self):
        self.samples = []

    def __call__(self, name, fn, *args):
        start = time.monotonic()
        result = fn(*args)
        self.samples.append((start, time.monotonic() - start, name))
        return result


def play_rounds(store, connect, rank, size, out_dir, timed):
    """Rounds until the last one rank 0 announces; returns (rounds, problems)."""
    problems = []
    stop_after = None
    r = 0
    started = time.monotonic()
    while stop_after is None or r < stop_after:
        if rank == 0 and stop_after is None and (os.path.exists(os.path.join(out_dir, "stop")) or time.monotonic() - started > 300):
            stop_after = r + 2  # the others are at most one round behind or ahead
            store.set("last_round", str(stop_after))
        timed("add", store.add, f"arrived/{r}", 1)
        timed("set", store.set, f"r{r}/{rank}", f"{rank}:{r}")
        if timed("wait", store.wait, [f"r{r}/{k}" for k in range(size)], 120_000) != OK:
            problems.append(f"round {r}: the barrier timed out")
        neighbour = (rank + 1) % size
        if (got := timed("get", store.get, f"r{r}/{neighbour}")) != f"{neighbour}:{r}":
            problems.append(f"round {r}: rank {neighbour}'s key holds {got!r}")
        if (arrived := store.get(f"arrived/{r}")) != str(size):
            problems.append(f"round {r}: {arrived} ranks arrived")
        if r >= 2:
            timed("delete", store.delete, f"r{r - 2}/{rank}")
        fresh = timed("connect", connect)
        if fresh.get(f"r{r}/{rank}") != f"{rank}:{r}":
            problems.append(f"round {r}: a fresh connection does not see this rank's key")
        fresh.close()
        if stop_after is None and (announced := store.get("last_round")) is not None:
            stop_after = int(announced)
        r += 1
    return r, problems


def main():
    out_dir = sys.argv[1]
    rank = int(os.environ["DDL_RANK"])
    size = int(os.environ["DDL_SIZE"])
    host, port = os.environ["DDL_STORE_ADDR"].rsplit(":", 1)
    token = os.environ["DDL_STORE_TOKEN"]
    timed = Timer()

    def connect():
        return Store(host, int(port), token)

    store = connect()
    if rank == 0:
        publish(out_dir, "store.token", token)
        publish(out_dir, "store.addr", f"{host}:{port}")
    rounds, problems = play_rounds(store, connect, rank, size, out_dir, timed)
    with open(os.path.join(out_dir, f"latency.{rank}.json"), "w") as f:
        json.dump(timed.samples, f)
    for p in problems[:10]:
        print(f"rank {rank}: {p}")
    print(f"rank {rank}: {rounds} rounds {'ok' if not problems else 'FAILED'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
