"""The Python layer's cost per op (issue 21): ddl.torch against libddl's C API, side by side.

    /usr/bin/python3 bench/python_op_cost.py                  # 2 ranks, fastest of 5 alternating runs
    /usr/bin/python3 bench/python_op_cost.py --repeat 9 --json /tmp/cost.json

Each run starts, under `ddl run --no-prefix -np N`:

  c-blocking   build/bench/ddl_allreduce_bench -b 4 -e 4: blocking ddl_allreduce of one float32, µs/call
  c-async      the same with --async: ddl_allreduce_async and at once ddl_wait, µs/call
  c-fused      build/bench/ddl_fusion_bench: a step of 1000 ddl_allreduce_async of 4 KiB, then ddl_wait each
  c-as-torch   the same with --as-ddl-torch: each op as ddl.torch submits it (named "allreduce.grad.N", with
               its shape), so that python / c-as-torch is what the Python layer adds to the very same ops
  python       this file with --worker: the same two through ddl.torch (hvd.allreduce_ of one float,
               and 1000 hvd.allreduce_async_ of 4 KiB plus hvd.synchronize of each; and
               hvd.synchronize(hvd.allreduce_async_(one float)) at once), and, on rank 0,
               where a call's time goes (--breakdown: each piece of the Python path timed alone)

Reported: the fastest run of each, the Python layer's cost over the C API (blocking: python - C,
µs; step: python / C), and the breakdown. Timed on one machine at a time: its load matters, so the
runs alternate and the spread (slowest/fastest) is printed too.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---- the worker: runs under ddl run ----

def worker(args):
    import torch

    import ddl.torch as hvd
    from ddl import _lib as L
    from ddl.common import host_ops
    from ddl.common.names import names
    from ddl.torch import mpi_ops

    torch.set_num_threads(1)
    hvd.init()
    one = torch.ones(1)
    for _ in range(args.warmup):
        hvd.allreduce_(one, op=hvd.Sum)
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(args.calls):
        hvd.allreduce_(one, op=hvd.Sum)
    blocking_us = (time.perf_counter() - start) / args.calls * 1e6
    for _ in range(args.warmup):
        hvd.synchronize(hvd.allreduce_async_(one, name="op_cost.async", op=hvd.Sum))
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(args.calls):
        hvd.synchronize(hvd.allreduce_async_(one, name="op_cost.async", op=hvd.Sum))
    async_us = (time.perf_counter() - start) / args.calls * 1e6

    grads = [torch.ones(args.floats) for _ in range(args.tensors)]
    step_names = [f"grad.{i}" for i in range(args.tensors)]

    def step():
        """Returns the time (ms) this rank took to submit the step's ops."""
        start = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=n, op=hvd.Sum) for g, n in zip(grads, step_names)]
        submitted = time.perf_counter()
        for h in handles:
            hvd.synchronize(h)
        return (submitted - start) * 1e3

    for _ in range(3):
        step()
    hvd.barrier()
    steps, submits = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        submits.append(step())
        steps.append((time.perf_counter() - start) * 1e3)
    median = sorted(range(len(steps)), key=steps.__getitem__)[len(steps) // 2]
    result = {"blocking_us": blocking_us, "async_us": async_us, "step_ms": steps[median], "step_min_ms": min(steps),
              "submit_ms": submits[median]}

    if args.breakdown and hvd.rank() == 0:
        result["breakdown"] = breakdown(torch, hvd, L, host_ops, names, mpi_ops)
    hvd.barrier()
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


def breakdown(torch, hvd, L, host_ops, names, mpi_ops):
    """µs per call of each piece of allreduce_async_'s path, timed alone on this rank (no peer takes
    part: nothing here is submitted to libddl)."""
    t = torch.ones(1024)
    target = hvd.global_process_set
    out = {}

    def best(stmt, number=20000):
        return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e6

    out["python call with 2 keywords (empty function)"] = best(lambda: (lambda x, name=None, op=None: x)(t, name="a", op=1))
    out["process set check (_process_set_target)"] = best(lambda: mpi_ops._process_set_target(target))
    out["reduce op check (_reduce_op)"] = best(lambda: mpi_ops._reduce_op(1, None))

    def claim_release():
        key, full = names.claim("allreduce", "grad.7", target)
        names.release(key, full)
    out["name claim + release"] = best(claim_release)
    out["name .encode()"] = best(lambda: "allreduce.grad.7".encode())
    out["options struct with shape (_options)"] = best(lambda: mpi_ops._options(target, None, t.shape, 1.0, 1.0))
    out["tensor reads (data_ptr x2, numel, dtype, is_contiguous x2, is_cuda)"] = best(
        lambda: (t.data_ptr(), t.data_ptr(), t.numel(), t.dtype, t.is_contiguous(), t.is_contiguous(), t.is_cuda))
    h = ctypes.c_void_p()
    out["ctypes call of a C function with 1 argument (ddl_test)"] = best(
        lambda: L.lib.ddl_is_initialized())
    out["c_void_p() + byref"] = best(lambda: ctypes.byref(ctypes.c_void_p()))
    pending = mpi_ops._Pending([h], t, [], None)
    out["handle registry (_register + pop)"] = best(lambda: mpi_ops._handle_map.pop(mpi_ops._register(pending)))
    return out


# ---- the driver ----

def run(cmd, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    r = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"python_op_cost: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def c_blocking(a, async_wait=False):
    out = run([a.ddl, "run", "--no-prefix", "--cpu", "-np", str(a.np), "--", os.path.join(a.build, "bench", "ddl_allreduce_bench"),
               "-b", "4", "-e", "4", "-w", str(a.warmup), "-n", str(a.calls), "--min-iters", str(a.calls)]
              + (["--async"] if async_wait else []))
    row = next(line for line in out.splitlines() if re.match(r"\s+4\s", line))
    return float(row.split()[3])


def c_fused(a, as_ddl_torch=False):
    out = run([a.ddl, "run", "--no-prefix", "--cpu", "-np", str(a.np), "--", os.path.join(a.build, "bench", "ddl_fusion_bench"),
               "--tensors", str(a.tensors), "--floats", str(a.floats), "--steps", str(a.steps)]
              + (["--as-ddl-torch"] if as_ddl_torch else []))
    row = next(line for line in out.splitlines() if re.match(rf"\s+{a.tensors}\s", line))
    return float(row.split()[3]), float(row.split()[4])


def python(a, breakdown, compiled=True):
    """The worker's figures; compiled=False makes ddl's faces call libddl through ctypes only."""
    cmd = [a.ddl, "run", "--no-prefix", "--cpu", "-np", str(a.np), "--", a.python, os.path.abspath(__file__), "--worker",
           "--calls", str(a.calls), "--warmup", str(a.warmup), "--tensors", str(a.tensors), "--floats", str(a.floats),
           "--steps", str(a.steps)] + (["--breakdown"] if breakdown else [])
    env = {"PYTHONPATH": os.path.join(a.build, "python"), "DDL_PYTHON_FASTPATH": "1" if compiled else "0"}
    out = run(cmd, env=env)
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))  # rank 0's
    return json.loads(line[len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddl", default=os.path.join(ROOT, "build", "cli", "ddl"))
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--floats", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--breakdown", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)

    has_compiled = glob.glob(os.path.join(a.build, "python", "ddl", "_fastpath*.so"))
    runs = {"c_blocking": [], "c_async": [], "c_step": [], "c_step_as_torch": [], "py_blocking": [], "py_async": [], "py_step": []}
    if has_compiled:
        runs.update(ctypes_blocking=[], ctypes_step=[])
    pieces = None
    for i in range(a.repeat):
        runs["c_blocking"].append(c_blocking(a))
        runs["c_async"].append(c_blocking(a, async_wait=True))
        runs["c_step"].append(c_fused(a)[0])
        runs["c_step_as_torch"].append(c_fused(a, as_ddl_torch=True)[0])
        py = python(a, breakdown=(i == 0))
        runs["py_blocking"].append(py["blocking_us"])
        runs["py_async"].append(py["async_us"])
        runs["py_step"].append(py["step_ms"])
        pieces = pieces or py.get("breakdown")
        line = (f"# run {i + 1}/{a.repeat}: C {runs['c_blocking'][-1]:.2f} us (async {runs['c_async'][-1]:.2f}), "
                f"{runs['c_step'][-1]:.3f} ms ({runs['c_step_as_torch'][-1]:.3f} ms as ddl.torch's ops); "
                f"python {runs['py_blocking'][-1]:.2f} us (async {runs['py_async'][-1]:.2f}), {runs['py_step'][-1]:.3f} ms")
        if has_compiled:
            py = python(a, breakdown=False, compiled=False)
            runs["ctypes_blocking"].append(py["blocking_us"])
            runs["ctypes_step"].append(py["step_ms"])
            line += f"; python over ctypes only {py['blocking_us']:.2f} us, {py['step_ms']:.3f} ms"
        print(line, flush=True)

    best = {k: min(v) for k, v in runs.items()}
    spread = {k: max(v) / min(v) for k, v in runs.items()}
    print(f"\n== {a.np} ranks, fastest of {a.repeat} alternating runs (spread = slowest/fastest) ==")
    print(f"blocking 4 B allreduce, us/call:  C API {best['c_blocking']:.2f} (x{spread['c_blocking']:.2f})  "
          f"ddl.torch allreduce_ {best['py_blocking']:.2f} (x{spread['py_blocking']:.2f})  "
          f"python over C: {best['py_blocking'] - best['c_blocking']:.2f} us (target <= 3)")
    print(f"async 4 B allreduce waited for at once, us/call:  C API {best['c_async']:.2f} (x{spread['c_async']:.2f})  "
          f"ddl.torch synchronize(allreduce_async_) {best['py_async']:.2f} (x{spread['py_async']:.2f})  "
          f"python over C: {best['py_async'] - best['c_async']:.2f} us")
    print(f"step of {a.tensors} x {a.floats * 4 // 1024} KiB async + wait, ms (median step):  "
          f"C API {best['c_step']:.3f} (x{spread['c_step']:.2f})  ddl.torch {best['py_step']:.3f} "
          f"(x{spread['py_step']:.2f})  python / C: {best['py_step'] / best['c_step']:.2f} (target <= 2)")
    print(f"the C step with ddl.torch's very ops (names 'allreduce.grad.N', shapes): {best['c_step_as_torch']:.3f} ms "
          f"(x{spread['c_step_as_torch']:.2f}); python / that: {best['py_step'] / best['c_step_as_torch']:.2f}")
    if has_compiled:
        print(f"the same through ctypes only (DDL_PYTHON_FASTPATH=0): {best['ctypes_blocking']:.2f} us "
              f"(x{spread['ctypes_blocking']:.2f}), step {best['ctypes_step']:.3f} ms (x{spread['ctypes_step']:.2f}), "
              f"python / C: {best['ctypes_step'] / best['c_step']:.2f}")
    else:
        print("(ddl's compiled per-op path is not in this build: the python figures are ctypes')")
    if pieces:
        print("\nthe general (Python) path's pieces, each alone (rank 0, us per call; a gradient's op takes the\n"
              "compiled path where ddl/_fastpath is built, the others and every op through ctypes take these):")
        for name, us in pieces.items():
            print(f"  {us:7.3f}  {name}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": a.np, "runs": runs, "best": best, "spread": spread, "breakdown": pieces,
                       "date": time.strftime("%Y-%m-%d %H:%M")}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
