"""Launch overhead: ddl against mpirun and torchrun, each starting 8 x `true`.

Run from the repository root, after building ddl:

    /usr/bin/python3 bench/launch_bench.py
    /usr/bin/python3 bench/launch_bench.py --repeat 50 --torchrun-repeat 5 --json out.json

For each launcher it does one warm-up run, then times --repeat runs (wall
clock, time.perf_counter around subprocess.run) and prints the median and
minimum, and the median's ratio to ddl's median. A launcher whose run exits
non-zero is reported as failed, not timed; one that is not installed is
reported as "not found" and skipped.

torchrun: Debian's torch 1.13 torchrun fails on Python 3.11 before starting
any worker (AttributeError: 'NoneType' object has no attribute 'get', in
to_map). Python 3.11 no longer yields the zero member Std.NONE when iterating
the IntFlag Std, so Std.from_str("0") returns None. The benchmark therefore
starts torchrun through a small `python -c` wrapper that patches
Std.from_str in memory (None becomes Std.NONE) and then calls
torch.distributed.run.main. Nothing on disk is changed. torch 1.13 spells
the options --no_python and --nproc_per_node.
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

from bench_common import cpu_model, positive_int

TORCHRUN_PATCH = """
import sys
from torch.distributed.elastic.multiprocessing.api import Std
_from_str = Std.from_str.__func__
def _fixed(cls, vm):
    r = _from_str(cls, vm)
    if isinstance(r, dict):
        return {k: Std.NONE if v is None else v for k, v in r.items()}
    return Std.NONE if r is None else r
Std.from_str = classmethod(_fixed)
from torch.distributed.run import main
sys.argv[0] = "torchrun"
main(sys.argv[1:])
"""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ddl", default="./build/cli/ddl", help="ddl binary")
    parser.add_argument("--np", type=positive_int, default=8, help="processes per launch")
    parser.add_argument("--repeat", type=positive_int, default=20,
                        help="timed runs for ddl and mpirun")
    parser.add_argument("--torchrun-repeat", type=positive_int, default=3,
                        help="timed runs for torchrun (about 6 s each)")
    parser.add_argument("--torchrun-monitor-interval", type=float, metavar="SECONDS",
                        help="pass --monitor_interval to torchrun (its default, 5 s, "
                        "is how often it polls its workers and dominates its time)")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="Python with torch, for torchrun")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds before one launch counts as failed")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    return parser.parse_args()


def torch_available(python):
    if not shutil.which(python):
        return False
    probe = subprocess.run([python, "-c", "import torch.distributed.run"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return probe.returncode == 0


def launchers(args):
    """(name, command or None when not installed, repeat) for each launcher."""
    n = str(args.np)
    ddl = args.ddl if shutil.which(args.ddl) else None
    mpirun = shutil.which("mpirun")
    torchrun = None
    if torch_available(args.python):
        torchrun = [args.python, "-c", TORCHRUN_PATCH, "--no_python", "--nproc_per_node", n]
        if args.torchrun_monitor_interval is not None:
            torchrun += ["--monitor_interval", str(args.torchrun_monitor_interval)]
        torchrun.append("true")
    return [
        ("ddl", ddl and [ddl, "run", "-np", n, "--", "true"], args.repeat),
        ("mpirun", mpirun and [mpirun, "--allow-run-as-root", "--oversubscribe",
                               "-np", n, "true"], args.repeat),
        ("torchrun", torchrun, args.torchrun_repeat),
    ]


def run_once(command, timeout):
    """Seconds one launch took, or raise RuntimeError saying why it failed."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout:g} s")
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        tail = proc.stdout.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(" | ".join([f"exit code {proc.returncode}"] + tail))
    return elapsed


def measure(name, command, repeat, timeout):
    """One warm-up run, then `repeat` timed ones; returns a result dict."""
    result = {"launcher": name, "command": command, "runs": 0}
    if not command:
        result["status"] = "not found"
        return result
    try:
        run_once(command, timeout)  # warm-up: page cache, first-run costs
        times = [run_once(command, timeout) for _ in range(repeat)]
    except RuntimeError as error:
        result.update(status="failed", error=str(error))
        return result
    result.update(status="ok", runs=len(times), times_ms=[t * 1e3 for t in times],
                  median_ms=statistics.median(times) * 1e3, min_ms=min(times) * 1e3)
    return result


def machine_info():
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def print_table(results):
    ddl = next((r for r in results if r["launcher"] == "ddl" and r["status"] == "ok"), None)
    print(f"{'launcher':<10} {'runs':>5} {'median ms':>10} {'min ms':>10} {'x ddl':>8}")
    for r in results:
        if r["status"] != "ok":
            detail = f"  ({r['error']})" if "error" in r else ""
            print(f"{r['launcher']:<10} {r['status']}{detail}")
            continue
        ratio = f"{r['median_ms'] / ddl['median_ms']:.1f}" if ddl else "-"
        print(f"{r['launcher']:<10} {r['runs']:>5} {r['median_ms']:>10.1f} "
              f"{r['min_ms']:>10.1f} {ratio:>8}")


def main():
    args = parse_args()
    info = machine_info()
    print(f"date {info['date']}  host {info['hostname']}")
    print(f"cpu {info['cpu']}, {info['cores']} cores; "
          f"{args.np} processes of `true` per launch")
    print()
    results = []
    for name, command, repeat in launchers(args):
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results.append(measure(name, command, repeat, args.timeout))
    print_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": info, "np": args.np, "results": results}, out, indent=2)
            out.write("\n")
    return 0 if all(r["status"] != "failed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
