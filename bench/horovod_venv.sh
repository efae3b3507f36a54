#!/usr/bin/env bash
# Bench-only virtual environment with real Horovod 0.28.1 (PyTorch + Gloo, CPU only), the peer that
# bench/optimizer_step_bench.py compares ddl.torch against. Not part of ddl and never used by it.
#
#     sudo bench/horovod_venv.sh            # creates or checks /var/cache/ddl/horovod-venv
#     /var/cache/ddl/horovod-venv/bin/horovodrun -np 2 --gloo -H localhost:2 \
#         /var/cache/ddl/horovod-venv/bin/python train.py
#     sudo bench/horovod_venv.sh tensorflow # /var/cache/ddl/horovod-tf-venv: Horovod on tensorflow-cpu
#                                           # 2.15.1 (Keras 2; the pins of scripts/tf_venv/keras2.txt), the
#                                           # peer of bench/keras_step_bench.py (0.28.1 builds on no later TF)
#
# Idempotent: when the venv already imports horovod.torch 0.28.1 it only says so and exits 0.
# The venv is made with --system-site-packages so it uses Debian's python3-torch (1.13); Horovod is
# compiled from the PyPI sdist against it (216 s on 2 AMD EPYC cores, 2026-11-22), with Gloo and without
# MPI, TensorFlow, MXNet, NCCL or CUDA.
#
# Needs root for apt-get (only when a package is missing). Debian packages it installs:
#   cmake g++ make      Horovod's CMake build (vendored Gloo, flatbuffers, Eigen, Boost parts)
#   python3-dev         Python.h
#   python3-venv        the venv (ensurepip)
#   libtorch-dev        the C++ headers: python3-torch ships torch/include/* only as symlinks into
#                       /usr/include/{torch,ATen,c10,...}, which libtorch-dev provides
#   pybind11-dev        torch/extension.h includes <pybind11/pybind11.h>; Debian's torch does not
#                       bundle it (pip's wheels do)
#
# Environment: HOROVOD_VENV (default /var/cache/ddl/horovod-venv), HOROVOD_BUILD_JOBS (default 2),
# HOROVOD_BUILD_LOG (default $HOROVOD_VENV.build.log).
# Exit status: 0 ready, 1 a step failed (see the log), 3 Horovod cannot be built here (one line says why).
set -euo pipefail

FRAMEWORK=${1:-torch}
case "$FRAMEWORK" in
  torch | tensorflow) ;;
  *) echo "horovod_venv: the framework must be torch or tensorflow, not '$FRAMEWORK'" >&2; exit 2 ;;
esac
if [ "$FRAMEWORK" = tensorflow ]; then
  VENV=${HOROVOD_VENV:-/var/cache/ddl/horovod-tf-venv}
else
  VENV=${HOROVOD_VENV:-/var/cache/ddl/horovod-venv}
fi
VERSION=0.28.1
JOBS=${HOROVOD_BUILD_JOBS:-2}
LOG=${HOROVOD_BUILD_LOG:-$VENV.build.log}
PY=$VENV/bin/python

check() {
    "$PY" - "$VERSION" "$FRAMEWORK" <<'EOF' >/dev/null 2>&1
import importlib, sys
import horovod
hvd = importlib.import_module("horovod." + sys.argv[2])
assert horovod.__version__ == sys.argv[1], horovod.__version__
assert hvd.gloo_built(), "no gloo"
EOF
}

if [ -x "$PY" ] && check; then
    echo "horovod_venv: Horovod $VERSION ($FRAMEWORK, gloo) already in $VENV"
    exit 0
fi

if [ "$FRAMEWORK" = torch ] && { [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; }; then
    echo "horovod_venv: cannot build: /usr/bin/python3 has no torch (apt-get install python3-torch first)" >&2
    exit 3
fi

# Debian packages, installed only when missing (apt-get is slow even as a no-op).
PKGS=(cmake g++ make python3-dev python3-venv)
[ "$FRAMEWORK" = torch ] && PKGS+=(libtorch-dev pybind11-dev)
missing=()
for p in "${PKGS[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "horovod_venv: needs root to apt-get install: ${missing[*]}" >&2
        exit 1
    fi
    echo "horovod_venv: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi

mkdir -p "$(dirname "$VENV")"
if [ ! -x "$PY" ] && [ "$FRAMEWORK" = torch ]; then
    echo "horovod_venv: creating $VENV (--system-site-packages: Debian's torch)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
elif [ ! -x "$PY" ]; then
    echo "horovod_venv: creating $VENV with the pins of scripts/tf_venv/keras2.txt (tensorflow-cpu 2.15.1)"
    /usr/bin/python3 -m venv "$VENV"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: \
        -r "$(dirname "$0")/../scripts/tf_venv/keras2.txt" >"$LOG" 2>&1
fi
if [ "$FRAMEWORK" = tensorflow ]; then
    WITH=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1)
else
    WITH=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1)
fi

# CPU-only: no HOROVOD_GPU_* op is asked for and Debian's torch has no CUDA (torch.version.cuda is
# None), so no CUDA code is compiled or linked. (Horovod's CMakeLists still enables the CUDA language
# when it finds an nvcc, e.g. /usr/local/cuda's; that only costs a few seconds of configure.)
unset HOROVOD_CUDA_HOME HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL \
    HOROVOD_GPU_REDUCESCATTER HOROVOD_WITH_MPI HOROVOD_WITH_TENSORFLOW HOROVOD_WITH_PYTORCH HOROVOD_WITH_MXNET

echo "horovod_venv: building Horovod $VERSION with $JOBS jobs (log: $LOG; about 4 min on 2 cores)"
start=$(date +%s)
# --no-build-isolation: the build must import Debian's torch, which an isolated build env hides.
# setuptools/wheel come from Debian through --system-site-packages.
if ! env "${WITH[@]}" HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= HOROVOD_GPU= HOROVOD_CPU_OPERATIONS=GLOO \
        MAKEFLAGS=-j"$JOBS" \
        nice -n 10 "$PY" -m pip install --no-cache-dir --no-build-isolation -v "horovod==$VERSION" >"$LOG" 2>&1; then
    echo "horovod_venv: pip install horovod==$VERSION failed after $(( $(date +%s) - start )) s; last lines of $LOG:" >&2
    tail -25 "$LOG" >&2
    exit 1
fi
echo "horovod_venv: built in $(( $(date +%s) - start )) s"

if ! check; then
    echo "horovod_venv: installed, but 'import horovod.$FRAMEWORK' fails:" >&2
    "$PY" -c "import horovod.$FRAMEWORK as hvd; print(hvd.gloo_built())" >&2 || true
    exit 1
fi
echo "horovod_venv: ready: $VENV/bin/horovodrun -np 2 --gloo -H localhost:2 $PY script.py"
