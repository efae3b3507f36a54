"""Rendezvous at scale: ddl's store against PyTorch's TCPStore, same pattern.

Run from the repository root, after building ddl (Debian's Python, which has
torch 1.13):

    /usr/bin/python3 bench/rendezvous_peers.py
    /usr/bin/python3 bench/rendezvous_peers.py --clients 64,512 --repeat 5 --json out.json
    /usr/bin/python3 bench/rendezvous_peers.py --torch-procs 2   # see "GIL" below

The pattern, for each N, is the one in bench/rendezvous_bench.cpp: N clients,
each with its own connection, each set "bench/N/<rank>", join a barrier (add 1
to "bench/N/barrier/arrived"; the client that makes it N sets
"bench/N/barrier/done"; all wait for that key), then get rank 0's key and both
ring neighbours' keys and check the values. The time is from starting the
clients to the last client finishing; connection set-up is included.

ddl: `ddl run -np 1 -- ddl_rendezvous_bench --clients N`; the figure is the
one the benchmark prints ("all done in X ms"): N threads in the worker
process, talking to the store that `ddl run` hosts in its own process.

TCPStore: the same shape. A server process holds the master TCPStore
(is_master=True, wait_for_workers=False, port 0); a client process runs N
threads, each with its own TCPStore(is_master=False) object. Both are child
/usr/bin/python3 processes of this script, so a crash or hang in torch costs
one measurement, not the benchmark; a measurement that takes longer than
--timeout (300 s) is killed and reported as failed, with the reason. Client
calls get the same 120 s timeout as ddl's clients. The clients' start is
synchronised: each client process imports torch, says "ready", and starts its
threads when told "go"; the clock starts at "go" (time.monotonic, which all
processes on one machine share) and ends at the last client's finish.

Both sides raise their RLIMIT_NOFILE soft limit to the hard limit. torch 1.13's
TCPStore client opens two connections (the second for watch callbacks, with
its own listener thread), so a client takes ~4 descriptors and one extra
thread; server and clients live in separate processes so that neither side
needs more descriptors than the hard limit at N=4096.

GIL: before measuring, the script probes which TCPStore calls release the GIL
(a ticker thread sleeping 1 ms in a loop, with a 100 ms switch interval; if the
call holds the GIL the ticker starves) and prints the answer. In torch 1.13
set/add/get/wait release it, but the TCPStore() constructor, which connects,
does not, so the clients' connections are made one at a time in a one-process
run. The default stays one process with N threads, as ddl's benchmark does,
because that is the like-for-like comparison; --torch-procs P splits the N
clients over P processes (N/P threads each, still one connection per client)
to show how much the GIL costs, and adds columns for that to the table.

Results go to stdout as a table (medians over --repeat runs, runs interleaved
ddl/TCPStore); --json FILE also writes every run.
"""

import argparse
import datetime
import json
import os
import re
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from bench_common import cpu_model, positive_int

TORCH_PYTHON = "/usr/bin/python3"
STORE_TIMEOUT_S = 120  # per call, as ddl_rendezvous_bench's clients
DDL_RESULT = re.compile(r"clients (\d+): all done in ([\d.]+) ms \(last connect at ([\d.]+) ms\); "
                        r"(\d+) failures")


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------

def raise_open_file_limit():
    """Soft RLIMIT_NOFILE up to the hard limit; returns the new soft limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def value_of(rank):
    return "addr-of-rank-" + str(rank)


def tail_of(text, lines=3):
    """Last few non-empty lines of a process's output, joined for one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


# --------------------------------------------------------------------------
# Child side: these run in /usr/bin/python3 children, never in the parent
# --------------------------------------------------------------------------

def child_serve():
    """Host the master TCPStore; print its port; stop when stdin closes."""
    import torch.distributed as dist
    raise_open_file_limit()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    print(server.port, flush=True)
    sys.stdin.read()
    os._exit(0)  # torch 1.13 can abort in TCPStore destructors at exit


def rendezvous(dist, port, rank, clients, marks):
    """One client: connect, set, barrier, read three peers. Returns bad reads."""
    prefix = f"bench/{clients}/"
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    marks["connected"][rank] = time.monotonic()
    store.set(prefix + str(rank), value_of(rank))
    if store.add(prefix + "barrier/arrived", 1) == clients:
        store.set(prefix + "barrier/done", "1")
    store.wait([prefix + "barrier/done"])
    bad = 0
    for peer in (0, (rank + clients - 1) % clients, (rank + 1) % clients):
        if store.get(prefix + str(peer)) != value_of(peer).encode():
            bad += 1
    marks["done"][rank] = time.monotonic()
    marks["stores"][rank] = store  # keep it open until every client is done
    return bad


def child_clients(port, clients, first, count):
    """Run clients first..first+count-1 in threads after "go"; print a JSON line."""
    import torch.distributed as dist
    raise_open_file_limit()
    marks = {"connected": {}, "done": {}, "stores": {}}
    failures, errors = [], []
    lock = threading.Lock()

    def client(rank):
        try:
            bad = rendezvous(dist, port, rank, clients, marks)
        except Exception as error:  # torch raises RuntimeError; keep any reason
            bad = 1
            with lock:
                errors.append(f"client {rank}: {type(error).__name__}: {error}")
        if bad:
            with lock:
                failures.append(rank)

    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    threads = [threading.Thread(target=client, args=(rank,))
               for rank in range(first, first + count)]
    started = 0
    try:
        for thread in threads:
            thread.start()
            started += 1
    except RuntimeError as error:  # "can't start new thread"
        errors.append(f"starting thread {started + 1} of {count}: {error}")
    for thread in threads[:started]:
        thread.join()
    report = {
        "end": time.monotonic(),
        "last_connect": max(marks["connected"].values(), default=None),
        "connected": len(marks["connected"]),
        "done": len(marks["done"]),
        "failures": len(failures) + count - started,
        "errors": errors[:3],
    }
    print(json.dumps(report), flush=True)
    os._exit(0)  # skip the TCPStore destructors (torch 1.13 may abort in them)


def ticks_during(call, seconds=0.2, max_calls=None):
    """(ticks, seconds): how often a 1 ms ticker thread ran while `call` looped."""
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < seconds and calls != max_calls:
        call()
        calls += 1
    end = time.perf_counter()
    stop.set()
    thread.join()
    return sum(start <= t <= end for t in ticks), end - start


def releases_gil(call, max_calls=None):
    """True if the ticker kept ticking (>= 1 per 4 ms) while `call` looped."""
    ticks, seconds = ticks_during(call, max_calls=max_calls)
    return ticks >= max(5, 0.25 * seconds * 1000)


def child_gil_probe():
    """Print JSON {call: true if it releases the GIL}, for TCPStore's calls.

    Values are 8 MiB so that set and get spend long enough outside Python for
    the ticker to notice; a pure-Python control (which holds the GIL) must
    come out as holding it, or the probe reports itself unreliable.
    """
    import torch.distributed as dist
    raise_open_file_limit()
    timeout = datetime.timedelta(seconds=10)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timeout)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
    big = "x" * (8 << 20)
    client.set("key", big)
    kept = []  # clients made by the probe stay open (destructors are slow)

    def connect():
        kept.append(dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout))

    # With a 100 ms switch interval a thread that holds the GIL through its
    # C++ call starves the ticker; one that releases it lets it tick ~1/ms.
    sys.setswitchinterval(0.1)
    if releases_gil(lambda: big + "y"):
        print(json.dumps({"error": "GIL probe unreliable on this machine"}), flush=True)
        os._exit(0)
    verdict = {
        "TCPStore() (connect)": releases_gil(connect, max_calls=500),
        "set": releases_gil(lambda: client.set("key", big)),
        "add": releases_gil(lambda: client.add("counter", 1)),
        "get": releases_gil(lambda: client.get("key")),
        "wait": releases_gil(lambda: client.wait(["key"])),
    }
    print(json.dumps(verdict), flush=True)
    os._exit(0)


# --------------------------------------------------------------------------
# Parent side: measurements
# --------------------------------------------------------------------------

def measure_ddl(args, clients):
    """One ddl run: {"ms": ..., "last_connect_ms": ...} or {"error": ...}."""
    command = [args.ddl, "run", "-np", "1", "--", args.bench, "--clients", str(clients)]
    try:
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:g} s"}
    output = proc.stdout.decode(errors="replace")
    match = DDL_RESULT.search(output)
    if proc.returncode != 0 or not match or int(match.group(4)) != 0:
        return {"error": f"exit code {proc.returncode}: {tail_of(output)}"}
    return {"ms": float(match.group(2)), "last_connect_ms": float(match.group(3))}


def read_line(proc, deadline, what):
    """A line from proc's stdout before `deadline` (monotonic), or raise."""
    remaining = deadline - time.monotonic()
    ready, _, _ = select.select([proc.stdout], [], [], max(0, remaining))
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{what}: no answer" if ready else f"{what}: timed out")
    return line.strip()


def start_child(args, mode, *extra, stderr=None):
    command = [args.python, os.path.abspath(__file__), mode, *map(str, extra)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)


def split_ranks(clients, procs):
    """(first, count) for each of `procs` client processes."""
    procs = min(procs, clients)
    base, extra = divmod(clients, procs)
    ranges, first = [], 0
    for i in range(procs):
        count = base + (1 if i < extra else 0)
        ranges.append((first, count))
        first += count
    return ranges


def collect_reports(workers, deadline):
    """Wait for every client process's JSON report; raise with a reason."""
    reports = []
    for proc, log in workers:
        try:
            out, _ = proc.communicate(timeout=max(0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError("timed out")
        log.seek(0)
        if proc.returncode != 0 or not out.strip():
            raise RuntimeError(f"client process exit code {proc.returncode}: "
                               f"{tail_of(log.read().decode(errors='replace'))}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def torch_run(args, clients, procs, deadline):
    """Server + client processes for one measurement; returns the result dict."""
    children = []
    try:
        server = start_child(args, "--serve", stderr=subprocess.DEVNULL)
        children.append(server)
        port = int(read_line(server, deadline, "TCPStore server"))
        workers = []
        for first, count in split_ranks(clients, procs):
            log = tempfile.TemporaryFile()
            proc = start_child(args, "--run-clients", port, clients, first, count, stderr=log)
            children.append(proc)
            workers.append((proc, log))
        for proc, _ in workers:
            read_line(proc, deadline, "client process start")
        start = time.monotonic()
        for proc, _ in workers:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = collect_reports(workers, deadline)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    failures = sum(r["failures"] for r in reports)
    if failures:
        errors = [e for r in reports for e in r["errors"]]
        raise RuntimeError(f"{failures} of {clients} clients failed: "
                           f"{errors[0] if errors else 'wrong value read'}")
    last_connect = max(r["last_connect"] for r in reports)
    return {"ms": (max(r["end"] for r in reports) - start) * 1e3,
            "last_connect_ms": (last_connect - start) * 1e3}


def measure_torch(args, clients, procs):
    """One TCPStore run: {"ms": ..., "last_connect_ms": ...} or {"error": ...}."""
    deadline = time.monotonic() + args.timeout
    try:
        return torch_run(args, clients, procs, deadline)
    except RuntimeError as error:
        reason = str(error)
        if reason.endswith("timed out"):
            reason += f" after {args.timeout:g} s"
        return {"error": reason}
    except (OSError, ValueError) as error:
        return {"error": f"{type(error).__name__}: {error}"}


def probe_gil(args):
    """{call: releases GIL} from a child, or {"error": ...}."""
    try:
        proc = subprocess.run([args.python, os.path.abspath(__file__), "--gil-probe"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
        return {"error": f"GIL probe failed: {error}"}


# --------------------------------------------------------------------------
# Parent side: summary and output
# --------------------------------------------------------------------------

def summarize(runs):
    """Median over the runs if all succeeded, else the first failure."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"status": "failed", "error": failed[0]["error"], "runs": runs}
    times = [r["ms"] for r in runs]
    return {"status": "ok", "median_ms": statistics.median(times), "min_ms": min(times),
            "runs": runs}


def torch_version(python):
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def machine_info(args):
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "open_file_limit": raise_open_file_limit(),
        "torch": torch_version(args.python),
        "load_average": os.getloadavg(),
    }


def print_header(info, gil, args):
    print(f"date {info['date']}  host {info['hostname']}")
    print(f"cpu {info['cpu']}, {info['cores']} cores; open-file limit {info['open_file_limit']}; "
          f"torch {info['torch']}")
    print("load average at start: " + " ".join(f"{x:.2f}" for x in info["load_average"]) +
          " (1, 5, 15 min; other work on the machine skews both sides)")
    if "error" in gil:
        print(gil["error"])
    else:
        held = [name for name, released in gil.items() if not released]
        released = [name for name, ok in gil.items() if ok]
        print(f"GIL: released by TCPStore {', '.join(released) or 'nothing'}; "
              f"held by {', '.join(held) or 'nothing'}")
        if held:
            print("     -> in a one-process run those calls are serialised (--torch-procs P to compare)")
    extra = "".join(f", and {p} processes x N/{p} threads" for p in args.torch_procs[1:])
    print(f"clients: own store object each (ddl 1 connection, TCPStore 1.13 2); "
          f"1 process x N threads{extra}")
    print(f"median of {args.repeat} runs, ms from starting the clients to the last one done")
    print()


def cell(result, width):
    return f"{result['median_ms']:>{width}.1f}" if result["status"] == "ok" else f"{'failed':>{width}}"


def ratio(result, base, width):
    if result["status"] == "ok" and base["status"] == "ok":
        return f"{result['median_ms'] / base['median_ms']:>{width}.1f}"
    return f"{'-':>{width}}"


def print_table(rows, procs):
    heads = ["N", "ddl ms", "TCPStore ms", "TCPStore/ddl"]
    for p in procs[1:]:
        heads += [f"TCPStore {p}p ms", f"{p}p/ddl"]
    widths = [max(len(h), 6) for h in heads]
    print("  ".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    for row in rows:
        cells = [f"{row['clients']:>{widths[0]}}", cell(row["ddl"], widths[1])]
        for i, p in enumerate(procs):
            result = row["torch"][str(p)]
            cells += [cell(result, widths[2 + 2 * i]), ratio(result, row["ddl"], widths[3 + 2 * i])]
        print("  ".join(cells))
    failures = [(row["clients"], name, result["error"]) for row in rows
                for name, result in [("ddl", row["ddl"])] +
                [(f"TCPStore {p}p", row["torch"][str(p)]) for p in procs]
                if result["status"] != "ok"]
    for clients, name, error in failures:
        print(f"  N={clients} {name} failed: {error}")


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def int_list(text):
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want positive integers, comma-separated")
    return values


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int_list, default=[64, 512, 4096],
                        help="client counts N, comma-separated (default 64,512,4096)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per N and side")
    parser.add_argument("--ddl", default="./build/cli/ddl", help="ddl binary")
    parser.add_argument("--bench", default="./build/bench/ddl_rendezvous_bench",
                        help="ddl_rendezvous_bench binary")
    parser.add_argument("--python", default=TORCH_PYTHON, help="Python with torch")
    parser.add_argument("--torch-procs", type=int_list, default=[1], metavar="P[,P...]",
                        help="TCPStore client layouts: 1 = N threads in one process "
                        "(always measured); more values add columns")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds before one measurement counts as failed")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    args = parser.parse_args()
    args.torch_procs = [1] + sorted(set(args.torch_procs) - {1})
    return args


def check_tools(args):
    missing = [path for path in (args.ddl, args.bench, args.python) if not shutil.which(path)]
    if missing:
        sys.exit(f"not found or not executable: {', '.join(missing)}")
    if not torch_version(args.python):
        sys.exit(f"{args.python} cannot import torch")


def run_child_mode(argv):
    """Dispatch the hidden child modes; returns False if argv is not one."""
    modes = {"--serve": child_serve, "--gil-probe": child_gil_probe,
             "--run-clients": lambda: child_clients(*map(int, argv[2:6]))}
    if len(argv) > 1 and argv[1] in modes:
        modes[argv[1]]()
        return True
    return False


def main():
    if run_child_mode(sys.argv):
        return 0
    args = parse_args()
    check_tools(args)
    info = machine_info(args)
    gil = probe_gil(args)
    print_header(info, gil, args)
    rows = []
    for clients in args.clients:
        runs = {"ddl": [], **{str(p): [] for p in args.torch_procs}}
        for i in range(args.repeat):
            print(f"N={clients} run {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
            runs["ddl"].append(measure_ddl(args, clients))
            for p in args.torch_procs:
                runs[str(p)].append(measure_torch(args, clients, p))
        rows.append({"clients": clients, "ddl": summarize(runs["ddl"]),
                     "torch": {str(p): summarize(runs[str(p)]) for p in args.torch_procs}})
    print_table(rows, args.torch_procs)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": info, "gil_released": gil, "repeat": args.repeat,
                       "torch_procs": args.torch_procs, "results": rows}, out, indent=2)
            out.write("\n")
    failed = any(r["ddl"]["status"] != "ok" for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
