"""What every side-by-side benchmark in bench/ records about the machine and the build it ran."""
import argparse
import datetime
import hashlib
import os
import platform
import subprocess
import time


def build_info(args):
    """Which libddl ran: the source commit (and whether the tree was dirty) and the library's hash."""
    info = {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        info["commit"] = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, timeout=30).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "runtime"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        info["runtime_dirty"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    lib = os.path.realpath(os.path.join(args.build, "runtime", "libddl.so"))
    try:
        with open(lib, "rb") as f:
            info["libddl_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
        info["libddl"] = lib
        info["libddl_mtime"] = datetime.datetime.fromtimestamp(os.path.getmtime(lib)).astimezone().isoformat(timespec="seconds")
    except OSError:
        pass
    return info


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def positive_int(text):
    """argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def run_timed(cmd, env, timeout):
    """Runs cmd to the end (or the timeout); returns what a result record needs in common:
    stdout, stderr, exit status (None on timeout), wall seconds and the load average before."""
    before = loadavg()
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = f"timed out after {timeout} s", None
    return out, err, rc, time.perf_counter() - start, before


def parse_with_variants(parser, variants):
    """parser.parse_args(), with --variants (comma-separated) checked against `variants` and split."""
    args = parser.parse_args()
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in variants]
    if bad:
        parser.error(f"unknown variant(s): {', '.join(bad)}")
    return args
