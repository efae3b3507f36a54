"""Two hosts of the test bed: ddl run and libddl against OpenMPI's mpirun and MPI_Allreduce, side by side.

Run from the repository root, on the machine itself (not inside a host of the bed), after building:

    /usr/bin/python3 bench/hosts_bench.py
    /usr/bin/python3 bench/hosts_bench.py --ddl /var/tmp/ddl-snapshot/bin/ddl --repeat 20 --json /tmp/hosts.json

The hosts are those of scripts/testbed.sh (ddlhost1, ddlhost2: network, UTS and mount namespaces
on this one machine, joined by veths, each with its own sshd). When `testbed.sh status` says the
bed is down the benchmark starts it (`testbed.sh start 2`) and stops it again at the end; a bed
that was already up is used as it is and left running (others may be using it). Everything runs
inside ddlhost1 (`testbed.sh exec ddlhost1 ...`); ssh between the hosts uses the bed's
/etc/ssh/ssh_config (its key and known hosts) for ddl and mpirun alike.

1. Launch, 2 hosts x 4 `true`:
       ddl run -H ddlhost1:4,ddlhost2:4 --cpu -- true
       mpirun --allow-run-as-root --oversubscribe -H ddlhost1:4,ddlhost2:4 --mca plm_rsh_agent ssh true
       ssh ddlhost2 true                     (reference: the one ssh connection both need at least)
   timed by a small loop that runs inside ddlhost1 (this same file, --inner-launch), so the cost
   of entering the bed is not in the figures: one warm-up of each, then --repeat rounds, each
   round running every command once (interleaved, so that load from other work on the machine
   falls on all of them alike). Median and minimum wall time; ratio of medians to ddl's.

2. Allreduce between the hosts, float32 sum in place, --sizes (default 1M..64M, doubling), with
   1 rank per host (2 ranks) and 4 ranks per host (8 ranks):
       libddl     ddl run --no-prefix -H ddlhost1:P,ddlhost2:P --cpu -- BUILD/bench/ddl_allreduce_bench ...
       mpi        mpirun --allow-run-as-root --oversubscribe -H ddlhost1:P,ddlhost2:P --mca plm_rsh_agent ssh
                    --mca btl tcp,vader,self --mca btl_tcp_if_include eth0 BUILD/bench/mpi_allreduce_bench ...
       mpi-yield  the same plus --mca mpi_yield_when_idle 1
   MPI: shared memory (vader) within a host, TCP on the bed's eth0 between hosts (--mpi-args
   replaces the `--mca btl ... eth0` words; Open MPI's defaults pick the same here: a host of
   the bed has only lo and eth0, and mpirun needs no --prefix, oob or btl setting to work on it). The bed's hosts
   share this machine's cores (2 on the development VM), and Open MPI's ranks busy-poll without
   yielding unless mpirun knows they are oversubscribed (-H host:4 declares 4 slots, so it does
   not): under any other load their waits then last whole scheduler slices (a floor of 8-24 ms
   per call was seen). mpi_yield_when_idle is Open MPI's own setting for oversubscribed nodes
   and is the fair peer on this machine; plain `mpi` is what a user gets by default.
   Both programs time themselves (nccl-tests style, mean per call, max over ranks) and print the
   same table, parsed here. With --allreduce-repeat R each runs R times, interleaved, and the
   fastest time per size is kept. Reported per size: time (us) and busbw (GB/s, algbw *
   2(n-1)/n) of each, and each MPI's time / libddl's (above 1: libddl faster). A run that fails,
   or whose correctness check counts wrong elements, is reported and left out.

The defaults keep a full run near 2-3 minutes on the 2-core development VM; the machine may be
shared, so the load average before and after each run is recorded in --json.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import build_info, cpu_model, loadavg, positive_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(ROOT, "scripts", "testbed.sh")
HOSTS = ("ddlhost1", "ddlhost2")
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$")
DEFAULT_MPI_ARGS = "--mca btl tcp,vader,self --mca btl_tcp_if_include eth0"
IMPLS = ["libddl", "mpi", "mpi-yield"]
PROGRAMS = {"libddl": "ddl_allreduce_bench", "mpi": "mpi_allreduce_bench", "mpi-yield": "mpi_allreduce_bench"}
LABELS = {"libddl": "libddl", "mpi": "OpenMPI", "mpi-yield": "OpenMPI yield"}


CHILD = None  # the process group running now, stopped when this script is terminated


def run_group(cmd, timeout):
    """Runs cmd in a process group of its own; returns (stdout, stderr, exit status or None on timeout).
    On the timeout the whole group gets SIGTERM (ddl run and mpirun pass it on to their workers on
    both hosts), then SIGKILL: killing only the first process would leave `testbed.sh exec`'s
    child, and its workers, running."""
    global CHILD
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    CHILD = proc
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
        return out or "", (err or "") + f"\ntimed out after {timeout:g} s", None
    finally:
        CHILD = None


def stop_group(proc):
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------- inside ddlhost1: the launch loop

def inner_launch(spec_json):
    """Runs inside ddlhost1: times the commands of the spec, prints one JSON object on stdout."""
    spec = json.loads(spec_json)
    commands, repeat, timeout = spec["commands"], spec["repeat"], spec["timeout"]

    def once(cmd):
        start = time.perf_counter()
        out, err, rc = run_group(cmd, timeout)
        elapsed = time.perf_counter() - start
        if rc is None:
            return None, f"timed out after {timeout:g} s"
        if rc != 0:
            tail = (out + err).strip().splitlines()[-5:]
            return None, " | ".join([f"exit code {rc}"] + tail)
        return elapsed, None

    results = {name: {"command": cmd, "times_s": [], "error": None} for name, cmd in commands}
    for round_no in range(repeat + 1):  # round 0 is the warm-up
        for name, cmd in commands:
            r = results[name]
            if r["error"]:
                continue
            elapsed, error = once(cmd)
            if error:
                r["error"] = f"{'warm-up' if round_no == 0 else f'run {round_no}'}: {error}"
            elif round_no > 0:
                r["times_s"].append(elapsed)
    json.dump({"host": socket.gethostname(), "results": results}, sys.stdout)
    return 0


# ---------------------------------------------------------------- outside: the bed

def testbed(*words, timeout=300, capture=True):
    return subprocess.run(["bash", TESTBED, *words], capture_output=capture, text=True, timeout=timeout)


def bed_up():
    try:
        return testbed("status", timeout=60).returncode == 0
    except subprocess.SubprocessError:
        return False


def ensure_bed():
    """Starts the bed when it is down; returns True when this run started it."""
    if bed_up():
        hosts = testbed("hosts", timeout=60).stdout.split()
        missing = [h for h in HOSTS if h not in hosts]
        if missing:
            # Restarting a bed of another size would pull it from under whoever uses it.
            sys.exit(f"hosts_bench: the test bed is up without {', '.join(missing)} (hosts: {' '.join(hosts)}); "
                     f"not restarting it")
        return False
    print("# test bed is down: starting it (bash scripts/testbed.sh start 2)", file=sys.stderr, flush=True)
    proc = testbed("start", "2", timeout=600)
    if proc.returncode != 0:
        sys.exit(f"hosts_bench: bash scripts/testbed.sh start 2 failed: {proc.stderr.strip()}")
    return True


def in_host(cmd):
    return ["bash", TESTBED, "exec", HOSTS[0]] + cmd


# ---------------------------------------------------------------- outside: header

def first_line(cmd, timeout=60):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return ((out.stdout or out.stderr).strip().splitlines() or [None])[0]
    except (OSError, subprocess.SubprocessError):
        return None


def header(args):
    class B:  # build_info wants .build
        build = args.build_dir
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "loadavg": loadavg(),
        "ddl": args.ddl,
        "ddl_version": first_line([args.ddl, "--version"]),
        "mpirun": first_line([args.mpirun, "--version"]),
        "python": sys.version.split()[0],
        "build": build_info(B),
        "settings": {k: getattr(args, k) for k in ("repeat", "allreduce_repeat", "parts", "impls", "sizes", "per_host",
                                                   "warmup", "iters", "min_iters", "budget", "mpi_args")},
    }
    b = meta["build"]
    print(f"# date: {meta['date']}")
    print(f"# machine: {meta['machine']}, {meta['cpu_model']}, {meta['cores']} cores, kernel {meta['kernel']}")
    print(f"# load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in meta['loadavg'] or [])}")
    print(f"# ddl: {args.ddl} (version {meta['ddl_version']}); {meta['mpirun']}")
    print(f"# libddl: {b.get('libddl')} (sha256 {b.get('libddl_sha256')}, built {b.get('libddl_mtime')}); "
          f"source commit {b.get('commit')}{' + uncommitted runtime/ changes' if b.get('runtime_dirty') else ''}")
    print(f"# hosts: {', '.join(HOSTS)} of scripts/testbed.sh (veths on one bridge, one sshd each); "
          f"everything runs inside {HOSTS[0]}")
    sys.stdout.flush()
    return meta


# ---------------------------------------------------------------- outside: 1. launch

def hostlist(per_host):
    return ",".join(f"{h}:{per_host}" for h in HOSTS)


def mpirun_base(args, per_host):
    return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-H", hostlist(per_host),
            "--mca", "plm_rsh_agent", "ssh"]


def launch_part(args):
    commands = [
        ("ddl", [args.ddl, "run", "-H", hostlist(4), "--cpu", "--", "true"]),
        ("mpirun", mpirun_base(args, 4) + ["true"]),
        ("ssh", ["ssh", HOSTS[1], "true"]),
    ]
    spec = {"commands": commands, "repeat": args.repeat, "timeout": args.timeout}
    print(f"# launch: warm-up + {args.repeat} rounds inside {HOSTS[0]} ...", file=sys.stderr, flush=True)
    before = loadavg()
    out, err, rc = run_group(in_host(["/usr/bin/python3", os.path.abspath(__file__), "--inner-launch", json.dumps(spec)]),
                             args.timeout * (args.repeat + 1) * len(commands) + 60)
    if rc != 0:
        print(f"# launch: the timing loop failed (exit {rc}): {err.strip()[-800:]}")
        return {"failure": err[-2000:]}, False
    data = json.loads(out)
    rows = []
    for name, _ in commands:
        r = data["results"][name]
        row = {"name": name, "command": r["command"], "runs": len(r["times_s"]),
               "times_ms": [t * 1e3 for t in r["times_s"]], "error": r["error"]}
        if r["times_s"] and not r["error"]:
            row["median_ms"] = statistics.median(r["times_s"]) * 1e3
            row["min_ms"] = min(r["times_s"]) * 1e3
        rows.append(row)
    ddl = rows[0].get("median_ms")
    labels = {
        "ddl": f"`ddl run -H {hostlist(4)} --cpu -- true`",
        "mpirun": f"`mpirun --allow-run-as-root --oversubscribe -H {hostlist(4)} --mca plm_rsh_agent ssh true`",
        "ssh": f"`ssh {HOSTS[1]} true` (reference)",
    }
    print(f"\n### Launch: 2 hosts x 4 `true`, timed inside {HOSTS[0]} (warm-up + {args.repeat} interleaved rounds)\n")
    print("| command | runs | median ms | min ms | x ddl (median) |")
    print("| --- | --- | --- | --- | --- |")
    ok = True
    for row in rows:
        if "median_ms" not in row:
            ok = False
            print(f"| {labels[row['name']]} | failed: {row['error']} | | | |")
            continue
        ratio = f"{row['median_ms'] / ddl:.2f}" if ddl else "-"
        print(f"| {labels[row['name']]} | {row['runs']} | {row['median_ms']:.1f} | {row['min_ms']:.1f} | {ratio} |")
    mpi = rows[1].get("median_ms")
    if ddl and mpi:
        print(f"\nmpirun / ddl (medians): {mpi / ddl:.2f}")
    sys.stdout.flush()
    return {"rows": rows, "loadavg_before": before, "loadavg_after": loadavg()}, ok


# ---------------------------------------------------------------- outside: 2. allreduce

def parse_table(text):
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            size, count, iters, us, algbw, busbw, wrong = m.groups()
            rows[int(size)] = {"count": int(count), "iters": int(iters), "time_us": float(us),
                               "algbw": float(algbw), "busbw": float(busbw), "wrong": int(wrong)}
    return rows, "# check: ok" in text


def allreduce_command(args, impl, per_host):
    flags = ["-b", args.sizes[0], "-e", args.sizes[1], "-w", str(args.warmup), "-n", str(args.iters),
             "--min-iters", str(args.min_iters), "--budget", args.budget]
    if impl == "libddl":
        return [args.ddl, "run", "--no-prefix", "-H", hostlist(per_host), "--cpu", "--",
                os.path.join(args.build_dir, "bench", PROGRAMS[impl])] + flags
    extra = ["--mca", "mpi_yield_when_idle", "1"] if impl == "mpi-yield" else []
    return (mpirun_base(args, per_host) + shlex.split(args.mpi_args) + extra
            + [os.path.join(args.build_dir, "bench", PROGRAMS[impl])] + flags)


def run_allreduce(args, impl, per_host):
    cmd = allreduce_command(args, impl, per_host)
    before = loadavg()
    start = time.perf_counter()
    binary = next(w for w in cmd if w.endswith("_allreduce_bench"))
    tries = 0
    while True:
        tries += 1
        out, err, rc = run_group(in_host(cmd), args.timeout)
        # The build directory may be rebuilt under us: a program briefly missing is tried again.
        if rc != 0 and tries < 4 and not os.access(binary, os.X_OK):
            time.sleep(5)
            continue
        break
    wall = time.perf_counter() - start
    rows, checked = parse_table(out)
    failure = None
    if rc is None:
        failure = f"timed out after {args.timeout:g} s"
    elif rc != 0:
        failure = f"exit status {rc}: {(err or out or '').strip()[-600:]}"
    elif not checked or any(r["wrong"] for r in rows.values()):
        failure = "correctness check failed"
    elif not rows:
        failure = "no table in the output"
    return {"command": cmd, "returncode": rc, "wall_s": wall, "loadavg_before": before, "loadavg_after": loadavg(),
            "stdout": out, "stderr": err, "rows": {str(k): v for k, v in rows.items()}, "failure": failure}


def best_rows(runs, n):
    best = {}
    for r in runs:
        if r["failure"]:
            continue
        for size, row in r["rows"].items():
            size = int(size)
            if size not in best or row["time_us"] < best[size]["time_us"]:
                best[size] = dict(row)
    for size, row in best.items():
        row["algbw"] = size / (row["time_us"] * 1e3)
        row["busbw"] = row["algbw"] * 2.0 * (n - 1) / n
    return best


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return str(b)


def fmt_us(us):
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}"


def allreduce_part(args):
    impls = []
    for impl in args.impls:
        path = os.path.join(args.build_dir, "bench", PROGRAMS[impl])
        for _ in range(6):
            if os.access(path, os.X_OK):
                impls.append(impl)
                break
            time.sleep(5)  # the build directory may be being rebuilt
        else:
            print(f"# allreduce: {path} is missing; {impl} skipped")
    peers = [i for i in impls if i != "libddl"]
    results, ok = {}, True
    for per_host in args.per_host:
        n = per_host * len(HOSTS)
        runs = {i: [] for i in impls}
        for rep in range(args.allreduce_repeat):
            for impl in impls:
                print(f"# allreduce: {impl}, {len(HOSTS)} x {per_host}, run {rep + 1}/{args.allreduce_repeat} ...",
                      file=sys.stderr, flush=True)
                r = run_allreduce(args, impl, per_host)
                runs[impl].append(r)
                la = r["loadavg_before"][0] if r["loadavg_before"] else float("nan")
                status = "FAILED: " + r["failure"] if r["failure"] else "ok"
                print(f"# {len(HOSTS)} x {per_host} {impl} run {rep + 1}: {status} ({r['wall_s']:.1f} s, load {la:.2f})",
                      flush=True)
                if r["failure"]:
                    ok = False
        best = {i: best_rows(runs[i], n) for i in impls}
        sizes = sorted({s for i in impls for s in best[i]})
        print(f"\n### Allreduce float32 sum, {len(HOSTS)} hosts x {per_host} rank{'s' if per_host > 1 else ''} "
              f"({n} ranks): time us / busbw GB/s, fastest of {args.allreduce_repeat}\n")
        ratio_cols = [p for p in peers if "libddl" in impls]
        print("| size | " + " | ".join(LABELS[i] for i in impls) + "".join(
            f" | {LABELS[p]} / libddl (time)" for p in ratio_cols) + " |")
        print("| --- " * (1 + len(impls) + len(ratio_cols)) + "|")
        table = []
        for s in sizes:
            entry = {"bytes": s}
            cells = [fmt_size(s)]
            for i in impls:
                row = best[i].get(s)
                if row:
                    cells.append(f"{fmt_us(row['time_us'])} / {row['busbw']:.3f}")
                    entry[i] = {"time_us": row["time_us"], "busbw": row["busbw"], "iters": row["iters"]}
                else:
                    cells.append("-")
            for p in ratio_cols:
                if "libddl" in entry and p in entry:
                    entry[f"{p}_over_libddl"] = entry[p]["time_us"] / entry["libddl"]["time_us"]
                    cells.append(f"{entry[f'{p}_over_libddl']:.2f}")
                else:
                    cells.append("-")
            print("| " + " | ".join(cells) + " |")
            table.append(entry)
        means = {}
        for p in ratio_cols:
            ratios = [e[f"{p}_over_libddl"] for e in table if f"{p}_over_libddl" in e]
            if ratios:
                means[p] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        if means:
            print("\ngeometric mean over sizes of the time ratio: " +
                  ", ".join(f"{LABELS[p]} / libddl {v:.2f}" for p, v in means.items()))
        sys.stdout.flush()
        results[str(per_host)] = {"ranks": n, "runs": runs, "table": table, "geomean_over_libddl": means}
    return results, ok


# ---------------------------------------------------------------- main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ddl", default="build/cli/ddl", help="ddl binary (default build/cli/ddl); it must be at the "
                   "same path on both hosts: a path under /work or /var/tmp is")
    p.add_argument("--build-dir", default="build", help="CMake build directory with bench/ddl_allreduce_bench "
                   "and bench/mpi_allreduce_bench (default build)")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--repeat", type=positive_int, default=10, help="timed launch rounds after the warm-up (default 10)")
    p.add_argument("--allreduce-repeat", type=positive_int, default=2,
                   help="runs of each allreduce benchmark, interleaved; the fastest time per size is kept (default 2)")
    p.add_argument("--parts", default="launch,allreduce", help="launch, allreduce or both (default)")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help=f"allreduce implementations, comma-separated subset of {','.join(IMPLS)} (default all)")
    p.add_argument("--sizes", default="1M:64M", help="MIN:MAX bytes, doubling (default 1M:64M)")
    p.add_argument("--per-host", default="1,4", help="ranks per host for the allreduce (default 1,4)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up allreduces per size (default 2)")
    p.add_argument("--iters", type=positive_int, default=20, help="most timed allreduces per size (default 20)")
    p.add_argument("--min-iters", type=positive_int, default=3, help="fewest timed allreduces per size (default 3)")
    p.add_argument("--budget", default="256M", help="timed allreduces per size = clamp(budget/size, min-iters, iters)")
    p.add_argument("--mpi-args", default=DEFAULT_MPI_ARGS,
                   help=f"extra mpirun words for the allreduce (default '{DEFAULT_MPI_ARGS}')")
    p.add_argument("--timeout", type=float, default=300, help="seconds before one command counts as failed")
    p.add_argument("--json", metavar="OUT", help="also write everything here")
    p.add_argument("--inner-launch", metavar="SPEC", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inner_launch is not None:
        return a
    a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    a.impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    if not a.impls or any(x not in IMPLS for x in a.impls):
        p.error(f"--impls takes a comma-separated subset of {','.join(IMPLS)}")
    if not a.parts or any(x not in ("launch", "allreduce") for x in a.parts):
        p.error("--parts takes launch, allreduce or launch,allreduce")
    try:
        a.sizes = [x.strip() for x in a.sizes.split(":")]
        assert len(a.sizes) == 2 and all(a.sizes)
        a.per_host = [int(x) for x in a.per_host.split(",") if x.strip()]
        assert a.per_host and all(x >= 1 for x in a.per_host)
    except (ValueError, AssertionError):
        p.error("--sizes takes MIN:MAX (e.g. 1M:64M), --per-host a comma-separated list of counts")
    # Absolute paths: the commands run inside a host of the bed, through ssh on the other.
    if os.sep in a.ddl:
        a.ddl = os.path.abspath(a.ddl)
    a.build_dir = os.path.abspath(a.build_dir)
    return a


def terminated(*_):
    if CHILD is not None:
        stop_group(CHILD)
    sys.exit("hosts_bench: terminated")


def main():
    args = parse_args()
    if args.inner_launch is not None:
        signal.signal(signal.SIGTERM, terminated)  # the outer run stopping takes the launch being timed along
        return inner_launch(args.inner_launch)
    if not os.access(args.ddl, os.X_OK):
        sys.exit(f"hosts_bench: {args.ddl} is not an executable (--ddl)")
    meta = header(args)
    # SIGTERM too ends through the `finally` below, which stops a bed this run started.
    signal.signal(signal.SIGTERM, terminated)
    started = ensure_bed()
    meta["bed_started_here"] = started
    results = {"meta": meta}
    ok = True
    try:
        if "launch" in args.parts:
            results["launch"], good = launch_part(args)
            ok = ok and good
        if "allreduce" in args.parts:
            results["allreduce"], good = allreduce_part(args)
            ok = ok and good
    finally:
        if started:
            print("# stopping the test bed this run started (bash scripts/testbed.sh stop)", file=sys.stderr, flush=True)
            testbed("stop", timeout=300)
    meta["loadavg_end"] = loadavg()
    print(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in meta['loadavg_end'] or [])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print(f"# wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
