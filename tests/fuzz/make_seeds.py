#!/usr/bin/env python3
"""Writes the binary seed corpora of tests/fuzz (store, negotiation) from readable descriptions.

The text corpora (site_profile, host_list, slurm_tasks) are plain files, edited by hand. Run from
anywhere: python3 tests/fuzz/make_seeds.py (it rewrites only the files named here).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = b"fuzz-token-0123456789abcdef"  # fuzz_store.cpp's kToken


def u8(v): return struct.pack("<B", v)
def u32(v): return struct.pack("<I", v)
def i64(v): return struct.pack("<q", v)
def s(b): return u32(len(b)) + b
def frame(body): return u32(len(body)) + body


# --- store: byte 0 = flags (1: harness authenticates first, 2: half-close), then the client's bytes
AUTH, SET, GET, ADD, WAIT, DELETE = 1, 2, 3, 4, 5, 6
store = {
    "set_get": u8(1) + frame(u8(SET) + s(b"a") + s(b"hello")) + frame(u8(GET) + s(b"a")) + frame(u8(GET) + s(b"missing")),
    "add": u8(1) + frame(u8(ADD) + s(b"n") + i64(5)) + frame(u8(ADD) + s(b"n") + i64(-2))
           + frame(u8(ADD) + s(b"n") + i64(2**63 - 1)) + frame(u8(SET) + s(b"t") + s(b"x")) + frame(u8(ADD) + s(b"t") + i64(1)),
    "wait_delete": u8(1) + frame(u8(SET) + s(b"k") + s(b"v")) + frame(u8(WAIT) + u32(1) + s(b"k") + i64(1000))
                   + frame(u8(WAIT) + u32(2) + s(b"k") + s(b"absent") + i64(1)) + frame(u8(DELETE) + s(b"k"))
                   + frame(u8(DELETE) + s(b"k")),
    "self_auth": u8(0) + frame(u8(AUTH) + s(TOKEN)) + frame(u8(SET) + s(b"rank0") + s(b"10.0.0.1:29500")) + frame(u8(GET) + s(b"rank0")),
    "wrong_token": u8(0) + frame(u8(AUTH) + s(b"not-the-token")) + frame(u8(GET) + s(b"a")),
    "half_close": u8(3) + frame(u8(WAIT) + u32(1) + s(b"x") + i64(5)) + frame(u8(SET) + s(b"x") + s(b"1"))
                  + frame(u8(GET) + s(b"x")) + u32(100) + b"cut",
    "oversized": u8(1) + frame(u8(GET) + s(b"a")) + u32(64 * 1024 * 1024 + 1),
    "malformed": u8(1) + frame(u8(9) + s(b"a")) + frame(u8(SET) + s(b"only-key")) + frame(u8(WAIT) + u32(3) + s(b"a")),
}

# --- negotiation: byte 0 = world size - 1, then serialized Announcements (runtime/src/engine/announcement.cpp)
ALLREDUCE, BROADCAST, ALLGATHERV, BARRIER, REDUCESCATTER, JOIN = 0, 1, 3, 5, 6, 9
FLOAT32, INT64 = 2, 5
SUM, AVERAGE = 0, 1
ONE = struct.unpack("<q", struct.pack("<d", 1.0))[0]
HALF = struct.unpack("<q", struct.pack("<d", 0.5))[0]


def op(name, kind=ALLREDUCE, dtype=FLOAT32, reduce=SUM, flags=0, root=0, count=4, counts=(), shape=(), pre=ONE, post=ONE, group=1):
    b = s(name) + u8(kind) + u8(dtype) + u8(reduce) + u8(flags) + i64(root) + i64(count) + u32(len(counts))
    b += b"".join(i64(c) for c in counts) + u32(len(shape)) + b"".join(i64(d) for d in shape)
    return b + i64(pre) + i64(post) + u32(group)


def announce(ops=(), expired=(), cached=(), finalizing=False, joined=False):
    body = u8((1 if finalizing else 0) | (2 if joined else 0)) + u32(len(ops)) + b"".join(ops)
    body += u32(len(expired)) + b"".join(s(n) for n in expired) + u32(len(cached)) + b"".join(u32(c) for c in cached)
    return frame(body)


negotiation = {
    "two_ranks_ready": u8(1) + announce([op(b"grad.0"), op(b"grad.1", shape=(2, 2))]) + announce([op(b"grad.1", shape=(2, 2)), op(b"grad.0")]),
    "mismatch": u8(1) + announce([op(b"w", count=4)]) + announce([op(b"w", count=5, dtype=INT64)]),
    "cached_steady_state": u8(1) + announce([op(b"g")]) + announce([op(b"g")]) + announce(cached=[0]) + announce(cached=[0]),
    "stall_expired": u8(2) + announce([op(b"x", kind=BROADCAST, root=1)]) + announce() + announce([op(b"x", kind=BROADCAST, root=1)])
                     + announce(expired=[b"x"]) + announce() + announce(),
    "join": u8(1) + announce([op(b"j", kind=JOIN, count=0)], joined=True)
            + announce([op(b"r", kind=REDUCESCATTER, reduce=AVERAGE, count=4, counts=(2, 2), pre=HALF)])
            + announce(joined=True) + announce([op(b"j", kind=JOIN, count=0)], joined=True),
    "finalize_one_rank": u8(0) + announce([op(b"b", kind=BARRIER, count=0), op(b"v", kind=ALLGATHERV, counts=(1, 3))], finalizing=True),
    "malformed": u8(1) + frame(u8(0) + u32(1) + s(b"cut")) + announce(cached=[7]) + announce(),
    "grouped_sizes_differ": u8(1) + announce([op(b"g.0", group=1)]) + announce([op(b"g.0", group=3), op(b"g.1", group=3)])
                            + announce() + announce([op(b"g.2", group=3)]),
    "crash_group_size_oom": u8(1) + announce([op(b"g.0", group=1)]) + announce([op(b"g.0", group=2**32 - 1)]),
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("store", store)
write("negotiation", negotiation)
