"""What DDL_CHECK_CALL_SITES=1 costs per op: the same blocking 4-float allreduces (ddl.torch named,
ddl.torch unnamed, torch.distributed on the `ddl` backend) on 2 ranks with the check off and on,
runs alternating, each variant's fastest run kept, and the ratio on/off.

    python3 bench/call_site_cost.py [--build build] [--repeat 3] [--ops 3000]

Each run is `ddl run -np 2 -- python3 call_site_cost.py --worker`; rank 0 prints µs per op."""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import build_info, cpu_model, loadavg, positive_int  # noqa: E402


def worker(ops):
    import torch
    import torch.distributed as dist
    import ddl.distributed  # noqa: F401  (registers the backend)
    import ddl.torch as hvd
    hvd.init()
    dist.init_process_group("ddl")
    x = torch.ones(4)

    def per_op(call):
        for _ in range(ops // 10):  # warm up
            call()
        start = time.perf_counter()
        for _ in range(ops):
            call()
        return (time.perf_counter() - start) / ops * 1e6

    result = {
        "ddl.torch named": per_op(lambda: hvd.allreduce_(x, name="cost", op=hvd.Sum)),
        "ddl.torch unnamed": per_op(lambda: hvd.allreduce_(x, op=hvd.Sum)),
        "torch backend": per_op(lambda: dist.all_reduce(x)),
    }
    hvd.synchronize(hvd.allreduce_async_(x, name="end"))  # every rank done before anyone leaves
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def one_run(args, check):
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"), DDL_CHECK_CALL_SITES="1" if check else "0")
    out = subprocess.run([os.path.join(args.build, "cli", "ddl"), "run", "-np", "2", "--", sys.executable, __file__,
                          "--worker", "--ops", str(args.ops)], env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"call_site_cost: a run failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--ops", type=positive_int, default=3000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.ops)
    best = {False: {}, True: {}}
    for _ in range(args.repeat):
        for check in (False, True):
            for name, us in one_run(args, check).items():
                best[check][name] = min(us, best[check].get(name, float("inf")))
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_model()}, load {loadavg()}, {json.dumps(build_info(args))}")
    print(f"{'op (4 floats, 2 ranks)':<22} {'off µs':>8} {'on µs':>8} {'on - off':>9} {'on/off':>7}")
    for name in best[False]:
        off, on = best[False][name], best[True][name]
        print(f"{name:<22} {off:>8.2f} {on:>8.2f} {on - off:>9.2f} {on / off:>7.2f}")


if __name__ == "__main__":
    main()
