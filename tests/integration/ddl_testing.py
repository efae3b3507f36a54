"""Helpers for the integration tests: run the built `ddl` on real programs, read the process table."""
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import time

DDL = os.environ.get("DDL_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "cli", "ddl"))
PYTHON = "/usr/bin/python3"  # Debian's Python, where python3-torch lives
LINE = re.compile(r"^\[(\d+)\] (.*)$")


def ddl_raw(*args, env=None, timeout=120, **kwargs):
    """Runs `ddl ARGS...` to the end; returns the CompletedProcess with text output. `env` entries
    override the test's environment (None removes one); a scheduler allocation the tests may run
    inside is hidden, so ddl behaves as on a workstation."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return subprocess.run([DDL, *args], env=full_env, capture_output=True, text=True, timeout=timeout, **kwargs)


def lines_by_rank(output):
    """{rank: [line, ...]} from ddl's "[rank] line" output; other lines go under None."""
    by_rank = {}
    for line in output.splitlines():
        m = LINE.match(line)
        key = int(m.group(1)) if m else None
        by_rank.setdefault(key, []).append(m.group(2) if m else line)
    return by_rank


def unique_marker():
    """A sleep duration unique to one test, so its processes can be found in the process table."""
    return f"3000.{secrets.randbelow(10**8):08d}"


def read_text(path):
    """The text of the file at `path`, "" while there is none."""
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def processes_with(marker):
    """PIDs of live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(pid))
    return found


def comm(pid):
    """A process's name, "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def sleeps_with(marker):
    """PIDs of the `sleep` processes whose command line contains `marker`: a worker script's sleep
    exists only once the worker has exec'd and got that far, unlike the launchers (ddl, salloc,
    srun) and shells whose command lines carry the marker too."""
    return [pid for pid in processes_with(marker) if comm(pid) == "sleep"]


def is_stopped(pid):
    """Whether process `pid` is stopped (state T: SIGSTOP, SIGTSTP); False once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def wait_until(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def kill_leftovers(marker):
    """Test cleanup only: never let a failing test leave its sleepers behind."""
    for pid in processes_with(marker):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def log(*parts):
    print(*parts, file=sys.stderr)


def ddl(*args, **kwargs):
    """`ddl run ARGS...` unless ARGS already name a subcommand."""
    if not args or args[0] not in ("run", "--help", "--version"):
        args = ("run", *args)
    return ddl_raw(*args, **kwargs)


SOURCE = os.environ.get("DDL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def start_local_slurm():
    """Starts the loopback Slurm (scripts/local_slurm.sh; quick when it is up already)."""
    started = subprocess.run(["bash", os.path.join(SOURCE, "scripts", "local_slurm.sh"), "start"], capture_output=True, text=True,
                             timeout=180)
    if started.returncode != 0:
        raise RuntimeError("the loopback Slurm did not start:\n" + started.stdout + started.stderr)


def slurm_env():
    """The test's environment, pointed at the loopback Slurm, without any allocation of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "DDL_"))}
    env["SLURM_CONF"] = os.path.join(os.environ.get("DDL_SLURM_DIR", "/tmp/ddl-slurm"), "slurm.conf")
    return env


def check_pmix_world(test, result, size):
    """A `collective_checks world` run that a PMIx launcher started, without ddl run: it exits 0,
    each rank reports its place in one node's world of `size`, and each passes its checks."""
    test.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
    lines = result.stdout.splitlines()
    test.assertEqual(sorted(line for line in lines if line.startswith("world ")),
                     [f"world rank {r} size {size} local {r}/{size} node 0" for r in range(size)])
    test.assertEqual(len([line for line in lines if line.startswith("PASS ")]), size)


# ctest runs the tests that compile ddl beside the others (tests/CMakeLists.txt): their compilers get
# the cores only when the other lane leaves them idle, so its timing stays as in a run alone.
BUILD_NICENESS = "nice -n 19"


def unprivileged_user(name):
    """A throwaway user without root (made once), whose home is a fresh folder under /tmp."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["/usr/sbin/useradd", "--system", "--create-home", "--home-dir", f"/tmp/{name}-home", "--shell", "/bin/bash",
                        name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def write_executable(folder, name, text):
    """Writes `text` (as is: a CR stays a CR) to FOLDER/NAME, executable; its path."""
    path = os.path.join(folder, name)
    with open(path, "w", newline="") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def copy_checkout(root, dest, user):
    """What a user would have: the checkout's files at `root` (tracked, and new ones not ignored), no
    build tree, copied to `dest` and owned by `user` (a pwd entry)."""
    files = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(root, rel)
        if os.path.isfile(src):
            dst = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", dest], check=True)
