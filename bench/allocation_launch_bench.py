"""Launch overhead inside a Slurm allocation: `ddl run` of 8 x `true` against raw `srun -n 8 true`
(and `srun --mpi=pmix -n 8 true`, which ddl uses when Slurm offers it), side by side in one
allocation of the loopback Slurm that the tests use (scripts/local_slurm.sh).

Run from the repository root, after building ddl (as root, like the tests):

    /usr/bin/python3 bench/allocation_launch_bench.py
    /usr/bin/python3 bench/allocation_launch_bench.py --repeat 50 --json out.json

The script starts the cluster if needed, takes one allocation (salloc -n 8) and runs itself inside
it (--inside). There each command gets a warm-up run, then --repeat runs in rotation (so drift in
the machine's load falls on all of them alike), timed as wall clock around subprocess.run. It
prints medians and minimums and each median's ratio to raw srun's.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from bench_common import cpu_model, loadavg, positive_int

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commands(ddl, tasks):
    return {
        "srun": ["srun", "-n", str(tasks), "true"],
        "srun --mpi=pmix": ["srun", "--mpi=pmix", "-n", str(tasks), "true"],
        "ddl run": [ddl, "run", "--cpu", "-np", str(tasks), "--", "true"],
        "ddl run --mpi none": [ddl, "run", "--cpu", "--mpi", "none", "-np", str(tasks), "--", "true"],
    }


def inside(args):
    cmds = commands(args.ddl, args.tasks)
    times = {name: [] for name in cmds}
    for name, cmd in cmds.items():  # warm-up
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    for _ in range(args.repeat):
        for name, cmd in cmds.items():
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            took = time.perf_counter() - start
            if proc.returncode != 0:
                sys.exit(f"{name} failed: {proc.stderr}")
            times[name].append(took * 1000)
    print(json.dumps(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--repeat", type=positive_int, default=30)
    parser.add_argument("--tasks", type=positive_int, default=8)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(args)

    subprocess.run(["bash", os.path.join(ROOT, "scripts", "local_slurm.sh"), "start"], check=True, capture_output=True, timeout=180)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDL_"))}
    env["SLURM_CONF"] = os.path.join(os.environ.get("DDL_SLURM_DIR", "/tmp/ddl-slurm"), "slurm.conf")
    ddl = os.path.join(args.build, "cli", "ddl")
    before = loadavg()
    proc = subprocess.run(["salloc", "-N1", "-n", str(args.tasks), sys.executable, os.path.abspath(__file__), "--inside",
                           "--ddl", ddl, "--repeat", str(args.repeat), "--tasks", str(args.tasks)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    baseline = statistics.median(times["srun"])
    results = {name: {"median_ms": round(statistics.median(t), 1), "min_ms": round(min(t), 1),
                      "ratio_to_srun": round(statistics.median(t) / baseline, 3)} for name, t in times.items()}
    record = {"date": datetime.date.today().isoformat(), "machine": f"{platform.node()}, {cpu_model()}, {os.cpu_count()} cpus",
              "slurm": subprocess.run(["srun", "--version"], capture_output=True, text=True, env=env).stdout.strip(),
              "tasks": args.tasks, "repeat": args.repeat, "loadavg_before": before, "results": results}
    print(f"{args.tasks} x true inside one allocation, {args.repeat} runs each ({record['slurm']}):")
    for name, r in results.items():
        print(f"  {name:18s} median {r['median_ms']:7.1f} ms  min {r['min_ms']:7.1f} ms  x{r['ratio_to_srun']:.2f} of srun")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
