#!/usr/bin/env bash
# The GPU checks and the GPU benchmark, for a session lent a machine with a GPU (which has PyTorch
# with CUDA but reaches no package registry, so what ddl needs is built here and carried there).
#
#   bash scripts/device_checks.sh bundle      # here: ddl, libddl, the Python package, gpu_checks and
#                                             # the shared libraries they need, into build/device
#                                             # (the build must have NCCL)
#   then, with the run tool, carrying "build/device":
#   bash scripts/device_checks.sh run         # there: every gpu check, then the allreduce benchmark;
#                                             # logs into $OUT (or ./device-out)
#
# Each check skips loudly (exit 77) where no GPU is visible, so `run` can be tried here too.
set -uo pipefail
cd "$(dirname "$0")/.."

# What is carried (the run tool carries at most 64 MiB): build/device, stripped.
bundle() {
  [ -x build/tests/gpu_checks ] || { echo "device_checks: build/tests/gpu_checks is missing: build with NCCL (cmake -DDDL_WITH_NCCL=ON, BUILD_TESTING=1)" >&2; exit 1; }
  rm -rf build/device && mkdir -p build/device/lib
  cp build/cli/ddl build/tests/gpu_checks build/device/
  cp -L build/runtime/libddl.so.0 build/device/lib/
  cp -r build/python build/device/python
  # Everything the binaries link that is not the C library's own or CUDA's (torch's wheels bring those).
  ldd build/cli/ddl build/runtime/libddl.so.0 build/tests/gpu_checks |
    awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libnccl|libddl)\.so' |
    while read -r lib; do cp -L "$lib" build/device/lib/; done
  # The C++ runtime only where the device's own is older than the one ddl was built with (see run).
  mkdir -p build/device/lib/fallback
  mv build/device/lib/libstdc++.so.6 build/device/lib/libgcc_s.so.1 build/device/lib/fallback/ 2>/dev/null
  strip --strip-debug build/device/ddl build/device/gpu_checks build/device/lib/*.so* build/device/lib/fallback/*
  du -sh build/device | sed 's/^/device_checks: carry /'
}

run_checks() {
  local out="${OUT:-$PWD/device-out}" python="${DDL_DEVICE_PYTHON:-python3}" failed=0
  mkdir -p "$out"
  local device="$PWD/build/device"
  export LD_LIBRARY_PATH="$device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" DDL_LIBRARY="$device/lib/libddl.so.0"
  export PYTHONPATH="$device/python" PYTHONDONTWRITEBYTECODE=1 DDL_BIN="$device/ddl"
  if ! "$DDL_BIN" --version > /dev/null 2>&1; then  # the device's libstdc++ is older than the build's
    export LD_LIBRARY_PATH="$device/lib/fallback:$LD_LIBRARY_PATH"
    "$DDL_BIN" --version || { echo "device_checks: the carried ddl does not run here" >&2; exit 1; }
  fi
  nvidia-smi -L > "$out/gpus.txt" 2>&1
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' > "$out/torch.txt" 2>&1
  one() {  # name, command...: its log in $out/NAME.log; 0 passed, 77 skipped, else failed
    local name=$1 rc
    shift
    (cd tests/integration && "$@") > "$out/$name.log" 2>&1
    rc=$?
    case $rc in 0) echo "device_checks: $name passed" ;; 77) echo "device_checks: $name SKIPPED (no GPU)" ;; *) echo "device_checks: $name FAILED ($rc): $out/$name.log"; failed=1 ;; esac
    return 0
  }
  one nccl_collectives "$device/gpu_checks"
  one ddl_torch "$python" torch_gpu_checks.py
  one torch_backend "$python" torch_backend_gpu_checks.py
  if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$DDL_BIN" run -np "$("$python" -c 'import torch; print(torch.cuda.device_count())')" -- \
      "$python" bench/gpu_allreduce_bench.py -e 64M > "$out/gpu_allreduce_bench.txt" 2>&1 || failed=1
    echo "device_checks: benchmark: $out/gpu_allreduce_bench.txt"
  fi
  exit $failed
}

case "${1:-}" in
  bundle) bundle ;;
  run) run_checks ;;
  *) echo "usage: bash scripts/device_checks.sh bundle|run" >&2; exit 2 ;;
esac
