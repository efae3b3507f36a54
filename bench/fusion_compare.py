"""Tensor fusion: libddl fused and unfused against per-tensor torch.distributed (gloo), side by side.

Run from the repository root, after building (cmake --build build):

    /usr/bin/python3 bench/fusion_compare.py
    /usr/bin/python3 bench/fusion_compare.py --np 2 4 --steps 20 --repeat 3 --json out.json

One "training step" allreduces --tensors float32 tensors of --floats elements
(default 1000 x 1024, 4 KiB each, 4 MiB in all), submitted together and then
all waited (see bench/fusion_bench.cpp and bench/torch_fusion_bench.py). Variants,
each started with `ddl run --no-prefix -np N`:

    libddl-fused    build/bench/ddl_fusion_bench (DDL_FUSION_THRESHOLD unset: 64 MiB)
    libddl-unfused  the same with DDL_FUSION_THRESHOLD=0
    torch-loop      torch_fusion_bench.py --mode loop: 1000 blocking all_reduce calls
    torch-async     --mode async: 1000 all_reduce(async_op=True), then wait all
    torch-flat      --mode flat: copy into one 4 MiB buffer, one all_reduce, copy back
                    (DDP's bucketing; the ideal fusion aims at)

(torch with GLOO_SOCKET_IFNAME=lo unless set, so gloo uses loopback as libddl
does.) Reported per world size: ms per step (mean over the timed steps, max over
ranks; with --repeat R the fastest of R runs), the fastest single step, and each
variant's time divided by libddl-fused's. A run that fails or whose correctness
check finds wrong elements is reported as failed.
"""

import argparse
import datetime
import json
import os
import platform
import re
import socket
import sys

from bench_common import build_info, cpu_model, loadavg, parse_with_variants, run_timed

VARIANTS = ["libddl-fused", "libddl-unfused", "torch-loop", "torch-async", "torch-flat"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddl", default="./build/cli/ddl", help="ddl binary")
    p.add_argument("--build", default="./build", help="CMake build directory")
    p.add_argument("--python", default="/usr/bin/python3", help="Python with torch")
    p.add_argument("--np", type=int, nargs="+", default=[2, 4], help="world sizes")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--floats", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=1, help="runs per variant; the fastest is kept")
    p.add_argument("--timeout", type=float, default=1200, help="seconds before one run counts as failed")
    p.add_argument("--json", metavar="FILE", help="also write everything here")
    return parse_with_variants(p, VARIANTS)


def command(args, variant, n):
    env = dict(os.environ)
    env.pop("DDL_FUSION_THRESHOLD", None)
    run = [args.ddl, "run", "--no-prefix", "-np", str(n), "--"]
    shape = ["--tensors", str(args.tensors), "--floats", str(args.floats), "--warmup", str(args.warmup),
             "--steps", str(args.steps)]
    if variant.startswith("libddl"):
        if variant == "libddl-unfused":
            env["DDL_FUSION_THRESHOLD"] = "0"
        return run + [os.path.join(args.build, "bench", "ddl_fusion_bench")] + shape, env
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mode = variant.split("-", 1)[1]
    script = os.path.join(os.path.dirname(__file__), "torch_fusion_bench.py")
    return run + [args.python, script, "--mode", mode] + shape, env


ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$")


def run_one(args, variant, n):
    cmd, env = command(args, variant, n)
    out, err, rc, wall, before = run_timed(cmd, env, args.timeout)
    row = None
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            row = {"step_ms": float(m.group(4)), "min_ms": float(m.group(5)), "wrong": int(m.group(6))}
    failure = None
    if rc != 0:
        failure = f"exit status {rc}: {(err or '').strip()[-500:]}"
    elif row is None:
        failure = "no result line in the output"
    elif row["wrong"] or "# check: ok" not in out:
        failure = "correctness check failed"
    return {"command": cmd, "fusion_threshold_env": env.get("DDL_FUSION_THRESHOLD"), "returncode": rc, "wall_s": wall,
            "loadavg_before": before, "loadavg_after": loadavg(), "stdout": out, "stderr": err, "result": row,
            "failure": failure}


def main():
    args = parse_args()
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "loadavg": loadavg(),
        "build": build_info(args),
        "settings": {k: getattr(args, k) for k in ("tensors", "floats", "warmup", "steps", "repeat", "np", "variants")},
    }
    print(f"# date: {meta['date']}")
    print(f"# host: {meta['host']}  kernel {meta['kernel']}")
    print(f"# cpu: {meta['cpu_model']}, {meta['cores']} cores ({meta['cores_usable']} usable)")
    print(f"# load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in meta['loadavg'] or [])}")
    b = meta["build"]
    print(f"# libddl: {b.get('libddl')} (sha256 {b.get('libddl_sha256')}, built {b.get('libddl_mtime')}); "
          f"source commit {b.get('commit')}{' + uncommitted runtime/ changes' if b.get('runtime_dirty') else ''}")
    print(f"# step = {args.tensors} allreduces (sum, in place) of {args.floats} float32 "
          f"({args.floats * 4} B each, {args.tensors * args.floats * 4} B in all); warm-up {args.warmup} steps, "
          f"{args.steps} timed; step(ms) = mean, max over ranks; repeat {args.repeat} (fastest kept)")
    sys.stdout.flush()
    results = {"meta": meta, "worlds": {}}
    ok = True
    for n in args.np:
        runs = {v: [] for v in args.variants}
        for rep in range(args.repeat):
            for v in args.variants:
                print(f"# running {v}, {n} ranks, repeat {rep + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                r = run_one(args, v, n)
                runs[v].append(r)
                la = r["loadavg_before"][0] if r["loadavg_before"] else float("nan")
                print(f"# {n} ranks, {v}, run {rep + 1}: {'FAILED: ' + r['failure'] if r['failure'] else 'ok'} "
                      f"({r['wall_s']:.1f} s, load {la:.2f})", flush=True)
                if r["failure"]:
                    ok = False
                    sys.stdout.write("".join("#   " + line + "\n" for line in (r["stdout"] + r["stderr"]).splitlines()[-20:]))
        best = {}
        for v in args.variants:
            good = [r["result"] for r in runs[v] if not r["failure"]]
            if good:
                best[v] = {"step_ms": min(g["step_ms"] for g in good), "min_ms": min(g["min_ms"] for g in good)}
        print(f"\n== {n} ranks: one step = {args.tensors} x {args.floats} float32 allreduces ==")
        print(f"{'variant':<16} {'step(ms)':>10} {'min(ms)':>10} {'/ libddl-fused':>15}")
        fused = best.get("libddl-fused", {}).get("step_ms")
        for v in args.variants:
            if v not in best:
                print(f"{v:<16} {'failed':>10}")
                continue
            ratio = f"{best[v]['step_ms'] / fused:>15.2f}" if fused else f"{'-':>15}"
            print(f"{v:<16} {best[v]['step_ms']:>10.2f} {best[v]['min_ms']:>10.2f} {ratio}")
        ratios = {}
        if fused:
            for v, key in (("libddl-unfused", "unfused/fused"), ("torch-loop", "torch-loop/fused"),
                           ("torch-async", "torch-async/fused"), ("torch-flat", "torch-flat/fused")):
                if v in best:
                    ratios[key] = best[v]["step_ms"] / fused
            print("ratios: " + ", ".join(f"{k} = {x:.2f}" for k, x in ratios.items()))
        sys.stdout.flush()
        results["worlds"][str(n)] = {"runs": runs, "best": best, "ratios": ratios}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"# wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
