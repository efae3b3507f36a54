"""Optimizer step on CPU: ddl.torch DistributedOptimizer vs torch DDP (gloo) vs Horovod 0.28.1, side by side.

Run from the repository root, after building (cmake --build build):

    /usr/bin/python3 bench/optimizer_step_bench.py
    /usr/bin/python3 bench/optimizer_step_bench.py --np 2 4 --steps 30 --json /tmp/optstep.json

One step = forward + backward + optimizer.step() of an MLP of --layers Linear(--width, --width) layers
(default 26 x 256: 52 parameter tensors, 1.71 M parameters, 6.8 MB of float32 gradients) on a fixed
batch of --batch rows, with the gradients averaged over the ranks. Every rank seeds torch the same and
trains on the same batch, so the averaged gradient equals the local one and every variant must end
with the same weights (checked: the sum of all weights after the run, compared across ranks and
across variants). Variants:

    local      no communication: N processes each train their own copy at once (the compute floor)
    ddl        ddl.torch DistributedOptimizer(SGD), started with `ddl run -np N`
               (PYTHONPATH=build/python; libddl's defaults: shared memory on one node)
    ddl-tcp    the same with DDL_SHM=0: libddl's Gloo-over-TCP transport, the one a multi-node job uses
    ddp        torch.nn.parallel.DistributedDataParallel over gloo, same `ddl run` (env:// init)
    ddp-ddl    the same DDP on torch.distributed's "ddl" backend (init_process_group("ddl"): libddl)
    ddp-nocomm the same DDP over gloo with a comm hook that hands each bucket back at once: DDP's own
               work (its hooks, copying gradients into buckets and back) without any communication,
               the floor of DDP on any backend (every rank trains on the same batch, so the weights
               still agree)
    horovod    horovod.torch 0.28.1 DistributedOptimizer(SGD) from bench/horovod_venv.sh's venv,
               started with `horovodrun -np N --gloo -H localhost:N` (skipped if the venv is absent)

Every worker uses --threads torch threads (default 1; 2 cores shared by up to 4 ranks), GLOO_SOCKET_IFNAME=lo.
After --warmup steps, --steps steps are timed; a step's time is the slowest rank's, and the table shows
the median and the fastest step in ms.

Then the Python layer's cost per op (--ops blocking allreduces of one float32, 2 ranks, --rounds rounds
with the labels taking turns; us/op: median and fastest round, and the extra over the C API: the median
over rounds of each round's difference): the C API directly through ctypes
(`ddl_allreduce(name, send, recv, 1, FLOAT32, SUM)`, and the async pair `ddl_allreduce_ex` + `ddl_wait`
that ddl.torch calls) vs ddl.torch's `hvd.allreduce`, `hvd.allreduce_`
and unnamed `hvd.allreduce`; and for reference horovod.torch's `hvd.allreduce` and `hvd.allreduce_`
(at most 500 ops a round), with its default 1 ms background cycle and with HOROVOD_CYCLE_TIME=0.1.

A worker that fails is reported with the tail of its output, and the run goes on with the next one.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

VARIANTS = ["local", "ddl", "ddl-tcp", "ddp", "ddp-ddl", "ddp-nocomm", "horovod"]
DEFAULT_VENV = "/var/cache/ddl/horovod-venv"
RESULT = "OPTSTEP_RESULT "


# ---------------------------------------------------------------------------------------------- workers

def make_model(args):
    """--layers Linear(width, width), with --wide: a pair Linear(width, wide), Linear(wide, width) in the
    middle (large gradients beside many small ones)."""
    import torch
    layers = []
    for i in range(args.layers):
        if args.wide and i == args.layers // 2:
            layers += [torch.nn.Linear(args.width, args.wide), torch.nn.ReLU(), torch.nn.Linear(args.wide, args.width),
                       torch.nn.ReLU()]
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def setup_torch(args):
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = make_model(args)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    return model, x, y


def timed_steps(args, model, opt, x, y, before_timing):
    import torch
    loss_fn = torch.nn.MSELoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    before_timing()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    return times, checksum


def report(rank, variant, size, all_times, checksums, extra=None):
    """all_times: [ranks][steps] seconds; checksums: one per rank."""
    if rank != 0:
        return
    per_step = [max(col) for col in zip(*all_times)]
    out = {"variant": variant, "ranks": size, "median_ms": statistics.median(per_step) * 1e3,
           "min_ms": min(per_step) * 1e3, "mean_ms": statistics.fmean(per_step) * 1e3,
           "rank0_median_ms": statistics.median(all_times[0]) * 1e3,
           "checksums": checksums, "ranks_agree": len(set(checksums)) == 1}
    if extra:
        out.update(extra)
    print(RESULT + json.dumps(out), flush=True)


def n_params(model):
    return sum(p.numel() for p in model.parameters()), len(list(model.parameters()))


def train_with_horovod_api(args, hvd, label, extra):
    """The ddl and Horovod variants: the same script, as a user would run it with either import."""
    import torch
    hvd.init()
    model, x, y = setup_torch(args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    times, checksum = timed_steps(args, model, opt, x, y, lambda: hvd.allreduce(torch.zeros(1), name="bench.sync"))
    t = hvd.allgather(torch.tensor([times], dtype=torch.float64)).tolist()
    c = hvd.allgather(torch.tensor([checksum], dtype=torch.float64)).tolist()
    numel, tensors = n_params(model)
    report(hvd.rank(), label, hvd.size(), t, c, {"params": numel, "tensors": tensors, **extra})
    return hvd


def worker_ddl(args):
    import ddl.torch as hvd
    train_with_horovod_api(args, hvd, "ddl-tcp" if os.environ.get("DDL_SHM") == "0" else "ddl", {}).shutdown()


def worker_horovod(args):
    import horovod
    import horovod.torch as hvd
    train_with_horovod_api(args, hvd, "horovod", {"horovod": horovod.__version__}).shutdown()


def worker_ddp(args):
    import torch
    import torch.distributed as dist
    backend = os.environ.get("DDL_BENCH_TORCH_BACKEND", "gloo")
    if backend == "ddl":
        import ddl.distributed  # noqa: F401  (registers the backend)
    dist.init_process_group(backend)
    model, x, y = setup_torch(args)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    no_comm = os.environ.get("DDL_BENCH_DDP_NO_COMM") == "1"
    if no_comm:
        ddp.register_comm_hook(None, bucket_handed_back)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    times, checksum = timed_steps(args, ddp, opt, x, y, dist.barrier)
    size = dist.get_world_size()
    t = [torch.zeros(len(times), dtype=torch.float64) for _ in range(size)]
    dist.all_gather(t, torch.tensor(times, dtype=torch.float64))
    c = [torch.zeros(1, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(c, torch.tensor([checksum], dtype=torch.float64))
    numel, tensors = n_params(model)
    label = "ddp-nocomm" if no_comm else "ddp-ddl" if backend == "ddl" else "ddp"
    report(dist.get_rank(), label, size, [r.tolist() for r in t], [r.item() for r in c],
           {"params": numel, "tensors": tensors, "torch": torch.__version__})
    dist.barrier()
    # Leave without tearing the process group down: in torch 1.13 a rank sometimes (1 run in 6 to 1 in 2,
    # 4 ranks) hung for good when the DDP object died: ~Reducer -> ~ProcessGroupGloo joins a gloo
    # worker thread that is freeing a tensor with a Python object and waits for the GIL, which the
    # main thread, inside the join, holds.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def bucket_handed_back(state, bucket):
    """A DDP comm hook that communicates nothing: the bucket, as it is, is the reduced gradient."""
    import torch
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def worker_local(args):
    """No communication: each of the N processes trains its own copy (the compute floor of a step with
    N ranks sharing the cores). Every rank reports; the driver keeps the slowest."""
    import torch
    model, x, y = setup_torch(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    times, checksum = timed_steps(args, model, opt, x, y, lambda: None)
    numel, tensors = n_params(model)
    report(0, "local", int(os.environ.get("WORLD_SIZE", "1")), [times], [checksum],
           {"params": numel, "tensors": tensors, "rank": int(os.environ.get("RANK", "0"))})


def per_op_rounds(args, fns):
    """fns: {label: callable doing one blocking op}; runs --rounds rounds of --ops calls each, the
    labels interleaved, and returns {label: median us/op over rounds, and every round}."""
    for fn in fns.values():
        for _ in range(max(args.ops // 10, 10)):
            fn()
    rounds = {k: [] for k in fns}
    for _ in range(args.rounds):  # round-robin, so a burst of other load hits every label alike
        for label, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(args.ops):
                fn()
            rounds[label].append((time.perf_counter() - t0) / args.ops * 1e6)
    return {k: {"us_per_op": statistics.median(v), "min_us_per_op": min(v), "rounds": v} for k, v in rounds.items()}


def worker_overhead(args):
    import ctypes
    import torch
    import ddl._lib as L
    import ddl.torch as hvd
    hvd.init()
    torch.set_num_threads(args.threads)
    fn = L.lib["ddl_allreduce"]  # a fresh function object: the argtypes set here stay here
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    send = torch.ones(1, dtype=torch.float32)
    recv = torch.zeros(1, dtype=torch.float32)
    sp, rp = send.data_ptr(), recv.data_ptr()
    name = b"bench.c_api"
    inplace = torch.ones(1, dtype=torch.float32)

    def c_api():
        st = fn(name, sp, rp, 1, L.FLOAT32, L.SUM)
        if st != L.SUCCESS:
            raise RuntimeError(f"ddl_allreduce: status {st}: {L.last_error()}")

    fn_ex = L.lib["ddl_allreduce_ex"]
    fn_ex.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.POINTER(L.OpOptions), ctypes.POINTER(ctypes.c_void_p)]
    fn_ex.restype = ctypes.c_int
    fn_wait = L.lib["ddl_wait"]
    fn_wait.argtypes = [ctypes.c_void_p]
    fn_wait.restype = ctypes.c_int
    opts = L.OpOptions()  # DDL_OP_OPTIONS_INIT
    opts.prescale = opts.postscale = 1.0
    opts_p = ctypes.byref(opts)
    recv_ex = torch.zeros(1, dtype=torch.float32)
    rxp = recv_ex.data_ptr()
    name_ex = b"bench.c_api_ex"
    h = ctypes.c_void_p()
    hp = ctypes.byref(h)

    def c_api_async():
        st = fn_ex(name_ex, sp, rxp, 1, L.FLOAT32, L.SUM, opts_p, hp)
        if st == L.SUCCESS:
            st = fn_wait(h)
        if st != L.SUCCESS:
            raise RuntimeError(f"ddl_allreduce_ex/ddl_wait: status {st}: {L.last_error()}")

    fns = {
        "C API via ctypes": c_api,
        "C API async: _ex + ddl_wait": c_api_async,
        "hvd.allreduce(name=...)": lambda: hvd.allreduce(send, name="bench.allreduce", op=hvd.Sum),
        "hvd.allreduce_(name=...)": lambda: hvd.allreduce_(inplace, name="bench.allreduce_", op=hvd.Sum),
        "hvd.allreduce (unnamed)": lambda: hvd.allreduce(send, op=hvd.Sum),
    }
    res = per_op_rounds(args, fns)
    ok = float(recv[0]) == hvd.size() and float(recv_ex[0]) == hvd.size()
    if hvd.rank() == 0:
        print(RESULT + json.dumps({"variant": "overhead-ddl", "ranks": hvd.size(), "ops": args.ops,
                                   "rounds": args.rounds, "results": res, "c_api_result_ok": ok}), flush=True)
    hvd.shutdown()


def worker_overhead_horovod(args):
    import torch
    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(args.threads)
    send = torch.ones(1, dtype=torch.float32)
    inplace = torch.ones(1, dtype=torch.float32)
    # Each op waits for Horovod's background cycle (HOROVOD_CYCLE_TIME, 1 ms by default): fewer ops.
    args.ops = min(args.ops, 500)
    args.rounds = min(args.rounds, 5)
    cycle = os.environ.get("HOROVOD_CYCLE_TIME", "1 (default)")
    res = per_op_rounds(args, {
        f"horovod hvd.allreduce(name=...), cycle {cycle} ms":
            lambda: hvd.allreduce(send, name="bench.allreduce", op=hvd.Sum),
        f"horovod hvd.allreduce_(name=...), cycle {cycle} ms":
            lambda: hvd.allreduce_(inplace, name="bench.allreduce_", op=hvd.Sum),
    })
    if hvd.rank() == 0:
        print(RESULT + json.dumps({"variant": "overhead-horovod", "ranks": hvd.size(), "ops": args.ops,
                                   "rounds": args.rounds, "results": res}), flush=True)
    hvd.shutdown()


WORKERS = {"local": worker_local, "ddl": worker_ddl, "ddp": worker_ddp, "horovod": worker_horovod, "overhead": worker_overhead,
           "overhead-horovod": worker_overhead_horovod}


# ---------------------------------------------------------------------------------------------- driver

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--ddl", default=os.path.join(ROOT, "build", "cli", "ddl"), help="ddl binary")
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="CMake build directory")
    p.add_argument("--python", default="/usr/bin/python3", help="Python with torch")
    p.add_argument("--horovod-venv", default=os.environ.get("HOROVOD_VENV", DEFAULT_VENV),
                   help="venv made by bench/horovod_venv.sh")
    p.add_argument("--np", type=int, nargs="+", default=[2, 4], help="world sizes")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--wide", type=int, default=0,
                   help="also a pair Linear(width, WIDE), Linear(WIDE, width) in the middle (0: none)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeat", type=int, default=1, help="runs per variant and world size; the lowest median is kept")
    p.add_argument("--ops", type=int, default=1000, help="allreduces per round in the per-op measurement")
    p.add_argument("--rounds", type=int, default=15, help="rounds of the per-op measurement (Horovod: at most 5)")
    p.add_argument("--overhead-np", type=int, default=2, help="ranks for the per-op measurement (0: skip it)")
    p.add_argument("--timeout", type=float, default=180, help="seconds before one run counts as failed")
    p.add_argument("--json", metavar="FILE", help="also write everything here")
    from bench_common import parse_with_variants
    return parse_with_variants(p, VARIANTS)


def worker_args(args, worker):
    return [os.path.abspath(__file__), "--worker", worker, "--layers", str(args.layers), "--width", str(args.width),
            "--wide", str(args.wide),
            "--batch", str(args.batch), "--lr", str(args.lr), "--seed", str(args.seed), "--threads", str(args.threads),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--ops", str(args.ops),
            "--rounds", str(args.rounds)]


def horovod_python(args):
    py = os.path.join(args.horovod_venv, "bin", "python")
    run = os.path.join(args.horovod_venv, "bin", "horovodrun")
    if not (os.access(py, os.X_OK) and os.access(run, os.X_OK)):
        return None, None, f"no Horovod venv at {args.horovod_venv} (make it with bench/horovod_venv.sh)"
    return py, run, None


def command(args, variant, n):
    """(argv, env) for one run, or (None, reason) when it cannot run here."""
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.pop("DDL_SHM", None)
    if variant in ("horovod", "overhead-horovod", "overhead-horovod-0.1"):
        py, run, why = horovod_python(args)
        if why:
            return None, why
        if variant == "overhead-horovod-0.1":
            env["HOROVOD_CYCLE_TIME"] = "0.1"
            variant = "overhead-horovod"
        # horovodrun's --gloo launcher uses the interface of the address it resolves localhost to.
        env["HOROVOD_GLOO_IFACE"] = env.get("HOROVOD_GLOO_IFACE", "lo")
        return [run, "-np", str(n), "--gloo", "-H", f"localhost:{n}", "--network-interface", "lo",
                py] + worker_args(args, variant), env
    if not os.access(args.ddl, os.X_OK):
        return None, f"no ddl binary at {args.ddl} (cmake --build build)"
    pypath = os.path.join(args.build, "python")
    env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    worker = {"local": "local", "ddl": "ddl", "ddl-tcp": "ddl", "ddp": "ddp", "ddp-ddl": "ddp", "ddp-nocomm": "ddp",
              "overhead": "overhead"}[variant]
    if variant == "ddl-tcp":
        env["DDL_SHM"] = "0"
    env["DDL_BENCH_TORCH_BACKEND"] = "ddl" if variant == "ddp-ddl" else "gloo"
    env["DDL_BENCH_DDP_NO_COMM"] = "1" if variant == "ddp-nocomm" else "0"
    if worker in ("ddl", "overhead") and not os.path.isdir(os.path.join(pypath, "ddl", "torch")):
        return None, f"no ddl.torch at {pypath}/ddl/torch (cmake --build build)"
    return [args.ddl, "run", "--no-prefix", "-np", str(n), "--", args.python] + worker_args(args, worker), env


def run_one(args, variant, n):
    from bench_common import loadavg, run_timed
    cmd, env = command(args, variant, n)
    if cmd is None:
        return {"variant": variant, "ranks": n, "skipped": env}
    out, err, rc, wall, before = run_timed(cmd, env, args.timeout)
    result = None
    for line in out.splitlines():
        at = line.find(RESULT)  # horovodrun prefixes lines with "[0]<stdout>:", ddl run --no-prefix does not
        if at >= 0:
            try:
                r = json.loads(line[at + len(RESULT):])
            except ValueError:
                continue
            if result is None or r.get("median_ms", 0) > result.get("median_ms", 0):
                result = r
    failure = None
    if rc != 0:
        failure = f"exit status {rc}"
    elif result is None:
        failure = "no result line in the output"
    elif "ranks_agree" in result and not result["ranks_agree"]:
        failure = f"ranks ended with different weights: {result['checksums']}"
    return {"variant": variant, "ranks": n, "command": cmd, "ddl_shm": env.get("DDL_SHM"), "returncode": rc,
            "wall_s": wall, "loadavg_before": before, "loadavg_after": loadavg(), "result": result,
            "failure": failure, "stdout": out, "stderr": err}


def show_failure(r):
    print(f"# {r['ranks']} ranks, {r['variant']}: FAILED: {r['failure']} ({r['wall_s']:.1f} s); output tail:")
    tail = (r["stdout"] + "\n" + (r["stderr"] or "")).strip().splitlines()[-25:]
    sys.stdout.write("".join("#   " + line + "\n" for line in tail))
    sys.stdout.flush()


def print_step_table(args, table):
    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    print(f"\n== optimizer step (forward + backward + step with gradient allreduce), ms; "
          f"median [fastest] of {args.steps} steps, slowest rank" +
          (f"; best of {args.repeat} runs" if args.repeat > 1 else "") + " ==")
    cols = [v for v in args.variants]
    print(f"{'ranks':>5} " + " ".join(f"{v:>18}" for v in cols) + f" {'ddl/ddp':>8} {'ddl/horovod':>11} {'ddp/ddp-ddl':>11}")
    for n in args.np:
        cells = []
        for v in cols:
            r = table.get((v, n))
            cells.append(f"{r['median_ms']:9.2f} [{r['min_ms']:6.2f}]" if r else f"{'-':>18}")
        d, p, h, b = (table.get((k, n), {}).get("median_ms") for k in ("ddl", "ddp", "horovod", "ddp-ddl"))
        print(f"{n:>5} " + " ".join(cells) + f" {ratio(d, p):>8} {ratio(d, h):>11} {ratio(p, b):>11}")
    print_communication_cost(args, table)


def print_communication_cost(args, table):
    """What communication adds to a step: each variant's median over its floor (ddl.torch and Horovod
    over `local`, each DDP over `ddp-nocomm`), and the best ratio any DDP backend could reach over
    gloo here, where its communication would cost nothing (ddp / ddp-nocomm)."""
    pairs = [("ddl", "local"), ("horovod", "local"), ("ddp", "ddp-nocomm"), ("ddp-ddl", "ddp-nocomm")]
    for n in args.np:
        med = {v: table.get((v, n), {}).get("median_ms") for v in ("local", "ddl", "horovod", "ddp", "ddp-ddl", "ddp-nocomm")}
        parts = [f"{v} {med[v] - med[floor]:.2f}" for v, floor in pairs if med[v] and med[floor]]
        if not parts:
            continue
        ceiling = f"; ddp/ddp-nocomm {med['ddp'] / med['ddp-nocomm']:.2f}" if med["ddp"] and med["ddp-nocomm"] else ""
        print(f"# {n} ranks, communication's cost over the floor (ms): " + ", ".join(parts) + ceiling)


def main():
    args = parse_args()
    if args.worker:
        import faulthandler
        import signal
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: where a stuck worker is
        WORKERS[args.worker](args)
        return 0
    from bench_common import build_info, cpu_model, loadavg
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)), "kernel": platform.release(), "loadavg": loadavg(),
        "build": build_info(args),
        "settings": {k: getattr(args, k) for k in ("layers", "width", "batch", "threads", "warmup", "steps", "repeat", "np",
                                                    "variants", "ops", "rounds", "overhead_np")},
    }
    print(f"# date: {meta['date']}")
    print(f"# host: {meta['host']}  kernel {meta['kernel']}")
    print(f"# cpu: {meta['cpu_model']}, {meta['cores']} cores ({meta['cores_usable']} usable)")
    print(f"# load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in meta['loadavg'] or [])}")
    b = meta["build"]
    print(f"# libddl: {b.get('libddl')} (sha256 {b.get('libddl_sha256')}); source commit {b.get('commit')}"
          f"{' + uncommitted runtime/ changes' if b.get('runtime_dirty') else ''}")
    n_tensors = 2 * args.layers + (4 if args.wide else 0)
    n_par = args.layers * (args.width * args.width + args.width)
    if args.wide:
        n_par += 2 * args.width * args.wide + args.wide + args.width
    wide = f" and a pair Linear({args.width},{args.wide}), Linear({args.wide},{args.width})" if args.wide else ""
    print(f"# model: MLP of {args.layers} Linear({args.width},{args.width}){wide}: {n_tensors} tensors, {n_par / 1e6:.2f} M "
          f"parameters ({n_par * 4 / 1e6:.1f} MB float32 gradients); batch {args.batch}, SGD lr {args.lr}, "
          f"{args.threads} torch thread(s) per rank; warm-up {args.warmup}, {args.steps} timed steps")
    sys.stdout.flush()

    start = time.perf_counter()
    results = {"meta": meta, "runs": []}
    table = {}
    ok = True
    for n in args.np:
        for rep in range(args.repeat):
            for v in args.variants:
                print(f"# running {v}, {n} ranks, run {rep + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                r = run_one(args, v, n)
                results["runs"].append(r)
                if "skipped" in r:
                    if rep == 0:
                        print(f"# {n} ranks, {v}: skipped: {r['skipped']}", flush=True)
                    continue
                if r["failure"]:
                    ok = False
                    show_failure(r)
                    continue
                if (v, n) not in table or r["result"]["median_ms"] < table[(v, n)]["median_ms"]:
                    table[(v, n)] = r["result"]
                la = r["loadavg_before"][0] if r["loadavg_before"] else float("nan")
                print(f"# {n} ranks, {v}, run {rep + 1}: ok ({r['wall_s']:.1f} s wall, load {la:.2f}), median step "
                      f"{r['result']['median_ms']:.2f} ms", flush=True)

    overhead = {}
    if args.overhead_np:
        for v in ("overhead", "overhead-horovod", "overhead-horovod-0.1"):
            print(f"# running {v}, {args.overhead_np} ranks ...", file=sys.stderr, flush=True)
            r = run_one(args, v, args.overhead_np)
            results["runs"].append(r)
            if "skipped" in r:
                print(f"# {v}: skipped: {r['skipped']}", flush=True)
            elif r["failure"]:
                ok = False
                show_failure(r)
            else:
                overhead.update(r["result"]["results"])
                if r["result"].get("c_api_result_ok") is False:
                    print("# overhead: the C API's allreduce gave a wrong sum", flush=True)
                    ok = False

    # The step table.
    if args.variants:
        print_step_table(args, table)
    sums = {f"{v}/{n}": r["checksums"][0] for (v, n), r in table.items() if v != "local"}
    if sums:
        vals = list(sums.values())
        spread = max(vals) - min(vals)
        agree = spread <= 1e-6 * max(1.0, max(abs(x) for x in vals))
        print(f"# final weights (sum of all parameters) {'agree' if agree else 'DIFFER'} across variants: "
              f"{min(vals):.6f} .. {max(vals):.6f}")
        results["weights_agree"] = agree
        if not agree:
            ok = False

    if overhead:
        print(f"\n== per-op cost of one blocking allreduce of 1 float32, {args.overhead_np} ranks, us/op; "
              f"{args.ops} ops a round, {args.rounds} rounds (Horovod: {min(args.ops, 500)} x {min(args.rounds, 5)}) ==")
        print(f"  {'':<56} {'median':>8} {'fastest':>8} {'over the C API':>15}")
        base = overhead.get("C API via ctypes")
        for label, r in overhead.items():
            extra = ""
            if base and not label.startswith("horovod") and label != "C API via ctypes":
                diffs = [a - b for a, b in zip(r["rounds"], base["rounds"])]
                r["over_c_api_us"] = statistics.median(diffs)
                extra = f"{r['over_c_api_us']:+15.1f}"
            print(f"  {label:<56} {r['us_per_op']:8.1f} {r['min_us_per_op']:8.1f} {extra}")

    results["overhead"] = overhead
    results["table"] = {f"{v}/{n}": r for (v, n), r in table.items()}
    print(f"\n# total {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
