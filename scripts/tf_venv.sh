#!/usr/bin/env bash
# Cached virtual environments with TensorFlow (CPU) from PyPI, for ddl.tensorflow / ddl.keras: their
# tests, examples and benchmarks (ddl itself never needs TensorFlow). Two flavours, because Horovod's
# Keras API differs between them and users have both:
#
#   bash scripts/tf_venv.sh keras2            # tensorflow-cpu 2.15.1 with Keras 2.15 (tf.keras is Keras 2)
#   bash scripts/tf_venv.sh keras3            # tensorflow-cpu 2.21.0 with Keras 3 (tf.keras is Keras 3)
#   bash scripts/tf_venv.sh keras3 --python   # the same, then the venv's python path (alone) on stdout
#
# Idempotent: quiet (one line on stderr) when the pinned versions are in place already. The venvs
# ($DDL_TF_VENV_ROOT, default /var/cache/ddl, as tf-keras2-venv and tf-keras3-venv) are made by
# Debian's /usr/bin/python3 WITHOUT system site packages: TensorFlow brings its own numpy (1.26 for
# 2.15, 2.x for 2.21), which must not meet Debian's. Every package is pinned in scripts/tf_venv/*.txt
# (the whole dependency closure, installed with --no-deps), so a venv made today and one made next
# year hold the same files.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: $0 keras2|keras3 [--python]"
flavour=${1:-}
case "$flavour" in
  keras2 | keras3) ;;
  -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "tf_venv: first argument must be keras2 or keras3, not '${flavour}' ($usage)" >&2; exit 2 ;;
esac
print_python=0
case "${2:-}" in
  "") ;;
  --python) print_python=1 ;;
  *) echo "tf_venv: unknown argument '$2' ($usage)" >&2; exit 2 ;;
esac

pins_file=scripts/tf_venv/$flavour.txt
venv=${DDL_TF_VENV_ROOT:-/var/cache/ddl}/tf-$flavour-venv
want=$(cat "$pins_file")
marker=$venv/.ddl-tf-pins
log=$venv.build.log
expect_keras=$([ "$flavour" = keras2 ] && echo 2 || echo 3)

ready() {
  [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]
}

if ! ready; then
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock" # one installer at a time (two test runs may start together)
  flock 9
  if ! ready; then
    if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
      echo "tf_venv: installing python3-venv" >&2
      sudo_cmd=()
      [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
      export DEBIAN_FRONTEND=noninteractive
      "${sudo_cmd[@]}" apt-get update -qq
      "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    fi
    echo "tf_venv: installing $(grep -E '^(tensorflow-cpu|keras)==' "$pins_file" | tr '\n' ' ')into $venv (log: $log)" >&2
    rm -rf "$venv"
    if ! {
      /usr/bin/python3 -m venv "$venv" &&
        "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-deps \
          --only-binary=:all: -r "$pins_file"
    } >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "tf_venv: error: the install failed (full log: $log)" >&2
      exit 1
    fi
    # TensorFlow imports, and tf.keras is the Keras this flavour promises.
    if ! TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" - "$expect_keras" >>"$log" 2>&1 <<'EOF'; then
import sys
import tensorflow as tf
import keras
print("tensorflow", tf.__version__, "keras", keras.__version__)
assert keras.__version__.split(".")[0] == sys.argv[1], f"keras {keras.__version__} is not Keras {sys.argv[1]}"
assert float(tf.reduce_sum(tf.ones([3]))) == 3.0
EOF
      tail -n 10 "$log" >&2
      echo "tf_venv: error: TensorFlow does not import in $venv (log: $log)" >&2
      exit 1
    fi
    printf '%s\n' "$want" >"$marker"
  fi
fi

echo "tf_venv: ready at $venv" >&2
if ((print_python)); then
  echo "$venv/bin/python"
fi
