"""Allreduce bandwidth: libddl against torch.distributed (gloo) and Open MPI, side by side.

Run from the repository root, after building (cmake --build build):

    /usr/bin/python3 bench/allreduce_compare.py
    /usr/bin/python3 bench/allreduce_compare.py --np 2 4 -e 64M --repeat 3 --json out.json

For every world size in --np it runs, one after the other, each implementation's
nccl-tests style benchmark over the same sizes with the same warm-up and
iteration rules, parses the table each prints on rank 0, and prints one
combined table: per size, time (us) and busbw (GB/s) of each implementation,
and libddl's busbw divided by the best busbw among the others.

    libddl   ddl run --no-prefix -np N -- build/bench/ddl_allreduce_bench
    torch    ddl run --no-prefix -np N -- /usr/bin/python3 bench/torch_allreduce_bench.py
             (ddl run gives torchrun's environment; init_process_group("gloo") via
             env://; GLOO_SOCKET_IFNAME=lo unless set, so that gloo uses loopback
             as libddl does. ddl run only starts the processes, so the launcher does
             not enter the timings.)
    torch-ddl  the same script on torch.distributed's "ddl" backend (--backend ddl:
             init_process_group("ddl"), libddl under torch's API); the gloo/ddl column is
             torch's gloo time over it (above 1: the ddl backend is faster)
    mpi      mpirun -np N build/bench/mpi_allreduce_bench   (Open MPI's defaults:
             shared memory between processes of one node)
    mpi-tcp  the same with --mca btl tcp,self --mca btl_tcp_if_include lo: TCP over
             loopback, the transport Gloo uses, for a like-for-like peer

With --repeat R every implementation runs R times (interleaved) and the fastest
time per size is kept (the machine may be shared; the load average before and
after every run is recorded in --json). A run that fails, or whose correctness
check counts wrong elements, is reported as failed and left out of the table.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

from bench_common import build_info, cpu_model, loadavg, run_timed

IMPLS = ["libddl", "torch", "torch-ddl", "mpi", "mpi-tcp"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddl", default="./build/cli/ddl", help="ddl binary")
    p.add_argument("--build", default="./build", help="CMake build directory")
    p.add_argument("--python", default="/usr/bin/python3", help="Python with torch")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", type=int, nargs="+", default=[2, 4], help="world sizes")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    p.add_argument("-b", "--minbytes", default="4")
    p.add_argument("-e", "--maxbytes", default="64M",
                   help="largest size (default 64M: on 2 cores 256M takes seconds per iteration)")
    p.add_argument("-w", "--warmup", default="10")
    p.add_argument("-n", "--iters", default="200", help="most timed iterations per size")
    p.add_argument("--min-iters", default="5")
    p.add_argument("--budget", default="1G", help="timed iterations per size = clamp(budget/size, min-iters, iters)")
    p.add_argument("--repeat", type=int, default=1, help="runs per implementation; the fastest time per size is kept")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before one run counts as failed")
    p.add_argument("--json", metavar="FILE", help="also write everything here")
    p.add_argument("--show-raw", action="store_true", help="print every run's own table too")
    a = p.parse_args()
    a.impls = [i.strip() for i in a.impls.split(",") if i.strip()]
    bad = [i for i in a.impls if i not in IMPLS]
    if bad:
        p.error(f"unknown implementation(s): {', '.join(bad)}")
    return a


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def header(args):
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "loadavg": loadavg(),
        "build": build_info(args),
        "torch": first_line([args.python, "-c", "import torch; print(torch.__version__)"]),
        "mpirun": first_line([args.mpirun, "--version"]),
        "settings": {k: getattr(args, k) for k in ("minbytes", "maxbytes", "warmup", "iters", "min_iters", "budget",
                                                   "repeat", "np", "impls")},
    }
    print(f"# date: {meta['date']}")
    print(f"# host: {meta['host']}  kernel {meta['kernel']}")
    print(f"# cpu: {meta['cpu_model']}, {meta['cores']} cores ({meta['cores_usable']} usable)")
    print(f"# load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in meta['loadavg'] or [])}")
    b = meta["build"]
    print(f"# libddl: {b.get('libddl')} (sha256 {b.get('libddl_sha256')}, built {b.get('libddl_mtime')}); "
          f"source commit {b.get('commit')}{' + uncommitted runtime/ changes' if b.get('runtime_dirty') else ''}")
    print(f"# torch {meta['torch']}; {meta['mpirun']}")
    print(f"# allreduce float32 sum, in place; sizes {args.minbytes}..{args.maxbytes} doubling; warm-up min({args.warmup}, timed); "
          f"timed iterations clamp({args.budget}/size, {args.min_iters}, {args.iters}); repeat {args.repeat} "
          f"(fastest kept); time = mean per iteration, max over ranks; busbw = algbw*2(n-1)/n")
    return meta


def command(args, impl, n):
    flags = ["-b", args.minbytes, "-e", args.maxbytes, "-w", args.warmup, "-n", args.iters,
             "--min-iters", args.min_iters, "--budget", args.budget]
    env = dict(os.environ)
    ddl_run = [args.ddl, "run", "--no-prefix", "-np", str(n), "--"]
    mpirun = [args.mpirun, "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        mpirun.insert(1, "--allow-run-as-root")
    if impl == "libddl":
        return ddl_run + [os.path.join(args.build, "bench", "ddl_allreduce_bench")] + flags, env
    if impl in ("torch", "torch-ddl"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        script = [args.python, os.path.join(os.path.dirname(__file__), "torch_allreduce_bench.py")]
        if impl == "torch-ddl":
            package = os.path.join(args.build, "python")
            env["PYTHONPATH"] = package + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            return ddl_run + script + ["--backend", "ddl"] + flags, env
        return ddl_run + script + flags, env
    binary = os.path.join(args.build, "bench", "mpi_allreduce_bench")
    if impl == "mpi":
        return mpirun + [binary] + flags, env
    return mpirun + ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", binary] + flags, env


def available(args, impl):
    if impl in ("libddl", "torch", "torch-ddl") and not os.access(args.ddl, os.X_OK):
        return f"{args.ddl} not found (build first)"
    if impl == "libddl" and not os.access(os.path.join(args.build, "bench", "ddl_allreduce_bench"), os.X_OK):
        return "ddl_allreduce_bench not built"
    if impl in ("torch", "torch-ddl"):
        if subprocess.run([args.python, "-c", "import torch.distributed"], capture_output=True).returncode != 0:
            return f"{args.python} cannot import torch.distributed"
    if impl in ("mpi", "mpi-tcp"):
        if not shutil.which(args.mpirun):
            return "mpirun not found"
        if not os.access(os.path.join(args.build, "bench", "mpi_allreduce_bench"), os.X_OK):
            return "mpi_allreduce_bench not built (MPI not found by CMake?)"
    return None


ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$")
BARRIER = re.compile(r"^# barrier time\(us\): ([\d.]+)", re.M)


def parse_table(text):
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            size, count, iters, us, algbw, busbw, wrong = m.groups()
            rows[int(size)] = {"count": int(count), "iters": int(iters), "time_us": float(us),
                               "algbw": float(algbw), "busbw": float(busbw), "wrong": int(wrong)}
    checked = "# check: ok" in text
    return rows, checked


def barrier_us(text):
    """The benchmark's barrier latency line, if it printed one (torch's does not)."""
    m = BARRIER.search(text)
    return float(m.group(1)) if m else None


def run_one(args, impl, n):
    cmd, env = command(args, impl, n)
    out, err, rc, wall, before = run_timed(cmd, env, args.timeout)
    rows, checked = parse_table(out)
    failure = None
    if rc != 0:
        failure = f"exit status {rc}: {(err or '').strip()[-500:]}"
    elif not checked or any(r["wrong"] for r in rows.values()):
        failure = "correctness check failed"
    elif not rows:
        failure = "no table in the output"
    return {"command": cmd, "returncode": rc, "wall_s": wall, "loadavg_before": before, "loadavg_after": loadavg(),
            "stdout": out, "stderr": err, "rows": {str(k): v for k, v in rows.items()}, "barrier_us": barrier_us(out),
            "failure": failure}


def best_rows(runs, n):
    """Fastest time per size over the successful runs; busbw recomputed from it."""
    best = {}
    for r in runs:
        if r["failure"]:
            continue
        for size, row in r["rows"].items():
            size = int(size)
            if size not in best or row["time_us"] < best[size]["time_us"]:
                best[size] = dict(row)
    factor = 2.0 * (n - 1) / n if n > 1 else 1.0
    for size, row in best.items():
        row["algbw"] = size / (row["time_us"] * 1e3)
        row["busbw"] = row["algbw"] * factor
    return best


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def print_combined(n, impls, best):
    sizes = sorted({s for i in impls for s in best.get(i, {})})
    peers = [i for i in impls if i not in ("libddl", "torch-ddl")]  # torch-ddl is libddl under torch's API
    line1 = f"{'':>6} {'':>10} "
    line2 = f"{'size':>6} {'bytes':>10} "
    for i in impls:
        line1 += f"| {i:^21} "
        line2 += f"| {'time(us)':>11} {'busbw':>8} "
    backends = "torch" in impls and "torch-ddl" in impls
    if backends:
        line1 += "| gloo/ddl "
        line2 += "| torch time ratio "
    if "libddl" in impls and "mpi" in impls:
        line1 += "| libddl/mpi "
        line2 += "| time ratio "
    if "libddl" in impls and peers:
        line1 += "| libddl/best"
        line2 += "| busbw ratio (best peer)"
    print(f"\n== {n} ranks: allreduce float32 sum (busbw in GB/s) ==")
    print(line1.rstrip())
    print(line2.rstrip())
    combined = []
    for s in sizes:
        text = f"{fmt_size(s):>6} {s:>10} "
        entry = {"bytes": s}
        for i in impls:
            row = best.get(i, {}).get(s)
            if row:
                text += f"| {row['time_us']:>11.2f} {row['busbw']:>8.4f} "
                entry[i] = {"time_us": row["time_us"], "busbw": row["busbw"]}
            else:
                text += f"| {'-':>11} {'-':>8} "
        if backends:
            gloo, ours = best.get("torch", {}).get(s), best.get("torch-ddl", {}).get(s)
            if gloo and ours:
                entry["torch_gloo_over_ddl_time"] = gloo["time_us"] / ours["time_us"]
                text += f"| {entry['torch_gloo_over_ddl_time']:>8.2f} "
            else:
                text += f"| {'-':>8} "
        if "libddl" in impls and "mpi" in impls:
            mine, mpi = best.get("libddl", {}).get(s), best.get("mpi", {}).get(s)
            if mine and mpi:
                entry["time_ratio_vs_mpi"] = mine["time_us"] / mpi["time_us"]
                text += f"| {entry['time_ratio_vs_mpi']:>10.2f} "
            else:
                text += f"| {'-':>10} "
        if "libddl" in impls and peers:
            mine = best.get("libddl", {}).get(s)
            others = [(best[p][s]["busbw"], p) for p in peers if s in best.get(p, {})]
            if mine and others:
                bw, who = max(others)
                ratio = mine["busbw"] / bw if bw > 0 else float("inf")
                text += f"| {ratio:>8.3f} ({who})"
                entry["ratio_vs_best_peer"] = ratio
                entry["best_peer"] = who
            else:
                text += f"| {'-':>8}"
        print(text.rstrip())
        combined.append(entry)
    sys.stdout.flush()
    return combined


def main():
    args = parse_args()
    meta = header(args)
    impls = []
    for impl in args.impls:
        why = available(args, impl)
        if why:
            print(f"# {impl}: skipped: {why}")
        else:
            impls.append(impl)
    results = {"meta": meta, "worlds": {}}
    ok = True
    for n in args.np:
        runs = {i: [] for i in impls}
        for rep in range(args.repeat):
            for impl in impls:
                print(f"# running {impl}, {n} ranks, repeat {rep + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                r = run_one(args, impl, n)
                runs[impl].append(r)
                status = "FAILED: " + r["failure"] if r["failure"] else "ok"
                la = r["loadavg_before"][0] if r["loadavg_before"] else float("nan")
                print(f"# {n} ranks, {impl}, run {rep + 1}: {status} ({r['wall_s']:.1f} s, load {la:.2f})", flush=True)
                if r["failure"]:
                    ok = False
                    sys.stdout.write("".join("#   " + line + "\n" for line in (r["stdout"] + r["stderr"]).splitlines()[-20:]))
                if args.show_raw:
                    sys.stdout.write(r["stdout"])
        best = {i: best_rows(runs[i], n) for i in impls}
        combined = print_combined(n, impls, best)
        summary = {}
        for i in impls:
            if best[i]:
                summary[i] = sum(r["busbw"] for r in best[i].values()) / len(best[i])
        print("avg busbw (GB/s): " + ", ".join(f"{i} {v:.4f}" for i, v in summary.items()))
        barriers = {i: min(b for b in (r["barrier_us"] for r in runs[i] if not r["failure"]) if b is not None)
                    for i in impls if any(r["barrier_us"] is not None and not r["failure"] for r in runs[i])}
        if barriers:
            line = "barrier (us): " + ", ".join(f"{i} {v:.2f}" for i, v in barriers.items())
            if "libddl" in barriers and "mpi" in barriers:
                line += f"; libddl/mpi time ratio {barriers['libddl'] / barriers['mpi']:.2f}"
            print(line)
        results["worlds"][str(n)] = {"runs": runs, "combined": combined, "avg_busbw": summary, "barrier_us": barriers}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"# wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
