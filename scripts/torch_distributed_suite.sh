#!/usr/bin/env bash
# torch's own test suite for process-group backends (torch/testing/_internal/distributed/
# distributed_test.py, as shipped with Debian's python3-torch) on backend "ddl" and on gloo beside
# it, driven as torch's test/distributed/test_distributed_spawn.py drives it: each test spawns
# WORLD_SIZE processes that init_process_group(BACKEND) through env://, so libddl's world comes
# through torch's store (issue 43).
#
#   bash scripts/torch_distributed_suite.sh [OUT_DIR] [unittest arguments, e.g. -k all_reduce]
#
# Environment: BACKENDS (default "gloo ddl"), WORLD_SIZE (default 2), GATES_OF, DDL_BUILD_DIR (default
# ./build; its python/ is the ddl package used). Writes OUT_DIR/BACKEND-WORLD_SIZE.log per backend,
# then prints each backend's counts (ok / skipped / FAIL / ERROR) and every test whose outcome
# differs between the backends. The whole suite at world size 2 is several hundred tests: over an
# hour on a 2-core machine; -k narrows it.
#
# The suite needs expecttest, which Debian lacks: it lives in a cached venv over Debian's torch
# ($DDL_TORCH_SUITE_VENV, default /var/cache/ddl/torch-suite-venv, --system-site-packages).
# A backend the suite does not know is a "plugin" to it; ddl also declares what it does (DDP,
# subgroups), as the suite's DistTestCases.backend_feature lets a backend say. Tests the suite gates
# on a backend's name ("Test requires backend to be one of {'nccl', 'gloo'}") skip on ddl, unless
# GATES_OF=gloo: then every backend's tests are chosen as for gloo (the suite's file is not edited;
# its skips are decided under gloo's name, and the tests run on the backend they were given).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-torch-suite-results}
shift $(( $# > 0 ? 1 : 0 ))
venv=${DDL_TORCH_SUITE_VENV:-/var/cache/ddl/torch-suite-venv}
build=${DDL_BUILD_DIR:-$here/build}
world=${WORLD_SIZE:-2}

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import expecttest" 2>/dev/null; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet expecttest==0.3.0
fi
"$venv/bin/python" -c "import torch; assert torch.__file__.startswith('/usr/lib/'), torch.__file__" \
  || { echo "torch_distributed_suite: $venv does not use Debian's torch" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The driver: the suite's test class with the spawning set-up, under the backend's name.
cat > "$scratch/run_suite.py" <<'EOF'
import os

from torch.testing._internal.common_distributed import DistTestCases
from torch.testing._internal.common_utils import run_tests

import ddl.distributed  # noqa: F401  (registers "ddl", in every spawned process too)

BACKEND = os.environ["BACKEND"]
# The backend whose name the suite's skips are decided by, when its tests are defined (at import):
# GATES_OF=gloo lets ddl enter the tests the suite gates on gloo's name. The tests then run with
# BACKEND, which the suite reads again at run time.
GATES_OF = os.environ.get("GATES_OF") or BACKEND
if BACKEND == "ddl":  # what ddl does, to the skips decided now and to the checks at run time
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("ddl")
os.environ["BACKEND"] = GATES_OF
import torch.testing._internal.distributed.distributed_test as suite  # noqa: E402

suite.BACKEND = os.environ["BACKEND"] = BACKEND
DistributedTest, TestDistBackend = suite.DistributedTest, suite.TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


# Spawned processes find the class by this name in the driver's module.
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = f"TestDistBackendWithSpawn{BACKEND.upper()}"
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn

if __name__ == "__main__":
    run_tests()
EOF

# Each test's outcome from unittest -v (a result may follow the test's line after its log lines).
cat > "$scratch/outcomes.py" <<'EOF'
import re
import sys

HEAD = re.compile(r"^(test_\w+) \(\S+\)(?: \.\.\. ?(.*))?$")  # a test with a docstring: " ... " ends the next line
DOC = re.compile(r"^.* \.\.\. ?(.*)$")
RESULT = re.compile(r"^(ok|FAIL|ERROR|skipped .*|expected failure|unexpected success)$")


def outcomes(path):
    found, current = {}, None
    for line in open(path, errors="replace"):
        line = line.strip()
        head = HEAD.match(line)
        if head:
            current, line = head.group(1), (head.group(2) or "").strip()
        elif current and DOC.match(line):
            line = DOC.match(line).group(1).strip()
        if current and RESULT.match(line):
            # The first outcome: after failures torch's run_tests may run the suite again.
            found.setdefault(current, "skipped" if line.startswith("skipped") else line)
            current = None
    return found


logs = {path.rsplit("/", 1)[-1].rsplit(".", 1)[0]: outcomes(path) for path in sys.argv[1:]}
for name, found in logs.items():
    counts = {}
    for outcome in found.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print(f"{name}: {len(found)} tests: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
names = sorted(set().union(*logs.values()))
for test in names:
    seen = {name: found.get(test, "-") for name, found in logs.items()}
    if len(set(seen.values())) > 1:
        print(f"  {test}: " + ", ".join(f"{name} {outcome}" for name, outcome in seen.items()))
EOF

logs=()
for backend in ${BACKENDS:-gloo ddl}; do
  mkdir -p "$scratch/tmp-$backend/barrier"
  log=$out/$backend-$world.log
  echo "torch_distributed_suite: $backend at world size $world -> $log" >&2
  start=$(date +%s)
  (cd "$scratch" && BACKEND=$backend WORLD_SIZE=$world TEMP_DIR=$scratch/tmp-$backend PYTHONPATH=$build/python \
     "$venv/bin/python" run_suite.py -v "$@") > "$log" 2>&1 || true
  echo "torch_distributed_suite: $backend took $(( $(date +%s) - start )) s" >&2
  logs+=("$log")
done
/usr/bin/python3 "$scratch/outcomes.py" "${logs[@]}"
