#!/usr/bin/env bash
# A cached virtual environment with PyTorch Lightning, for the integration test test_lightning.py
# only (ddl itself never needs Lightning). Idempotent: quiet (one line on stderr) when the pinned
# versions are in place already.
#
#   bash scripts/lightning_venv.sh            # create or update; "lightning_venv: ready at PATH" on stderr
#   bash scripts/lightning_venv.sh --python   # the same, then the venv's python path (alone) on stdout
#
# The venv ($DDL_LIGHTNING_VENV, default /var/cache/ddl/lightning-venv) is made by Debian's
# /usr/bin/python3 with --system-site-packages, so Debian's python3-torch (1.13) is the torch it
# uses. PyPI's torch must never come in: every package is pinned and installed with --no-deps, and
# the result is checked (torch still Debian's 1.13, loaded from /usr/lib).
#
# Why pytorch-lightning 2.2.5: the newest release line whose floor is torch 1.13 (2.1.x: 1.12, 2.3.x:
# 2.0). Debian versions its torch 1.13.0a0+gitunknown, a pre-release of 1.13.0 to PEP 440, so
# Lightning <= 2.1, which gates its 1.13 code on torch >= 1.13.0, takes the 1.12 paths and fails
# to import (torch._UntypedStorage); 2.2 has no such gate. Its metadata's torch>=1.13.0 is the same
# pre-release mismatch, one more reason for --no-deps. The dependencies are pinned to releases of
# the same months that still accept torch 1.13 (torchmetrics >= 1.5 wants torch 2). Not installed:
# fsspec's [http] extra (aiohttp...), which only remote URLs need. numpy, PyYAML, packaging,
# typing_extensions and setuptools come from Debian.
set -euo pipefail

venv=${DDL_LIGHTNING_VENV:-/var/cache/ddl/lightning-venv}
pins=(
  pytorch-lightning==2.2.5
  torchmetrics==1.4.0.post0
  lightning-utilities==0.11.2
  fsspec==2024.3.1
  tqdm==4.66.4
)
want="${pins[*]}"
marker=$venv/.ddl-lightning-pins
log=$venv.build.log

print_python=0
case "${1:-}" in
  "") ;;
  --python) print_python=1 ;;
  -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "lightning_venv: unknown argument '$1' (usage: $0 [--python])" >&2; exit 2 ;;
esac

ready() {
  [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] &&
    "$venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("pytorch_lightning") is None)' 2>/dev/null
}

if ! ready; then
  mkdir -p "$(dirname "$venv")"
  # One installer at a time (two test runs may start together).
  exec 9>"$venv.lock"
  flock 9
  if ! ready; then
    missing=()
    for p in python3-venv python3-torch; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
      echo "lightning_venv: installing ${missing[*]}" >&2
      sudo_cmd=()
      [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
      export DEBIAN_FRONTEND=noninteractive
      "${sudo_cmd[@]}" apt-get update -qq
      "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi

    echo "lightning_venv: installing ${pins[*]} into $venv (log: $log)" >&2
    rm -f "$marker"
    if ! {
      /usr/bin/python3 -m venv --system-site-packages "$venv" &&
        "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-deps \
          --only-binary=:all: "${pins[@]}"
    } >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "lightning_venv: error: the install failed (full log: $log)" >&2
      exit 1
    fi

    # Debian's torch, nothing from PyPI, and Lightning importable on top of it.
    if ! "$venv/bin/python" - "$venv" >>"$log" 2>&1 <<'EOF'
import os, sys
import torch, pytorch_lightning, torchmetrics, lightning_utilities
venv = os.path.realpath(sys.argv[1])
torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
print("torch", torch.__version__, torch_dir)
print("pytorch_lightning", pytorch_lightning.__version__, "torchmetrics", torchmetrics.__version__)
assert torch.__version__.startswith("1.13"), f"torch {torch.__version__} is not Debian's 1.13"
assert torch_dir.startswith("/usr/lib/python3/dist-packages/"), f"torch comes from {torch_dir}, not Debian"
assert not torch_dir.startswith(venv + os.sep), "a torch was installed into the venv"
EOF
    then
      tail -n 10 "$log" >&2
      echo "lightning_venv: error: the venv does not use Debian's torch 1.13 (log: $log)" >&2
      exit 1
    fi
    if compgen -G "$venv/lib/python3*/site-packages/torch" >/dev/null; then
      echo "lightning_venv: error: a torch was installed into $venv; remove the venv and run again" >&2
      exit 1
    fi
    printf '%s\n' "$want" >"$marker"
  fi
fi

echo "lightning_venv: ready at $venv" >&2
if ((print_python)); then
  echo "$venv/bin/python"
fi
