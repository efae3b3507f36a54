"""The cost breakdown of a libddl timeline: per phase, how many events, their median and mean
duration, and the mean time from an op's first event to its last (submit to done).

    DDL_TIMELINE=/tmp/t.json ddl run -np 2 -- build/bench/ddl_allreduce_bench -b 4 -e 4 -n 2000
    /usr/bin/python3 bench/timeline_phases.py /tmp/t.json [--op NAME]

Phases are those libddl writes (docs/libddl.md): NEGOTIATE (submit until every rank's submission
is known), WAIT (agreed until its collective starts), the collective (`allreduce`, `barrier`, ...
for one op; MEMCPY_IN_FUSION_BUFFER, ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER for a fused one packed
into a fusion buffer, ALLREDUCE alone for one reduced straight from the ops' buffers)."""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline")
    p.add_argument("--op", help="only ops whose name starts with this")
    a = p.parse_args()
    with open(a.timeline) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    if a.op:
        events = [e for e in events if e["args"]["op"].startswith(a.op)]
    if not events:
        print("no events", file=sys.stderr)
        return 1
    phases = {}
    for e in events:
        phases.setdefault(e["name"], []).append(e["dur"])
    print(f"{'phase':<26} {'events':>8} {'median(us)':>11} {'mean(us)':>10}")
    for name, durs in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:<26} {len(durs):>8} {statistics.median(durs):>11.2f} {statistics.mean(durs):>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
