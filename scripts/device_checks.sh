#!/usr/bin/env bash
# The GPU checks and the GPU benchmark, for a session lent a machine with a GPU (which has PyTorch
# with CUDA but reaches no package registry, so what ddl needs is built here and carried there).
#
#   bash scripts/device_checks.sh bundle      # here: ddl, libddl, the Python package, gpu_checks and
#                                             # the shared libraries they need, into build/device
#                                             # (the build must have NCCL)
#   then, with the run tool, carrying "build/device":
#   bash scripts/device_checks.sh run         # there: every gpu check, the CPU checks on its torch
#                                             # 2.x, Lightning on the GPU, then the allreduce benchmark
#                                             # and the Python per-op cost benchmark (CPU);
#                                             # logs into $OUT/device-logs.tgz (or ./device-out)
#
# Each check skips loudly (exit 77) where no GPU is visible, so `run` can be tried here too.
set -uo pipefail
cd "$(dirname "$0")/.."

# What is carried (the run tool carries at most 64 MiB): build/device, stripped.
bundle() {
  [ -x build/tests/gpu_checks ] || { echo "device_checks: build/tests/gpu_checks is missing: build with NCCL (cmake -DDDL_WITH_NCCL=ON, BUILD_TESTING=1)" >&2; exit 1; }
  # bin/ and python/ side by side, as an installed ddl has them: `ddl run --torch-backend` finds the
  # package beside the command.
  rm -rf build/device && mkdir -p build/device/lib build/device/bin
  cp build/cli/ddl build/tests/gpu_checks build/device/bin/
  cp -L build/runtime/libddl.so.0 build/device/lib/
  cp -r build/python build/device/python
  mkdir -p build/device/bench  # python_op_cost.py --build build/device finds them there
  cp build/bench/ddl_allreduce_bench build/bench/ddl_fusion_bench build/device/bench/
  # Everything the binaries link that is not the C library's own or CUDA's (torch's wheels bring those).
  ldd build/cli/ddl build/runtime/libddl.so.0 build/tests/gpu_checks build/bench/ddl_allreduce_bench build/bench/ddl_fusion_bench |
    awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libnccl|libddl)\.so' |
    while read -r lib; do cp -L "$lib" build/device/lib/; done
  # The C++ runtime only where the device's own is older than the one ddl was built with (see run).
  mkdir -p build/device/lib/fallback
  mv build/device/lib/libstdc++.so.6 build/device/lib/libgcc_s.so.1 build/device/lib/fallback/ 2>/dev/null
  strip --strip-debug build/device/bin/* build/device/bench/* build/device/lib/*.so* build/device/lib/fallback/*
  du -sh build/device | sed 's/^/device_checks: carry /'
}

run_checks() {
  # The tool brings back at most 8 files from $OUT: every log goes into one archive, the summary
  # and the benchmark's table also to stdout.
  local out="${OUT:-$PWD/device-out}" python="${DDL_DEVICE_PYTHON:-python3}" failed=0
  local logs
  logs=$(mktemp -d)
  mkdir -p "$out"
  local device="$PWD/build/device"
  export LD_LIBRARY_PATH="$device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" DDL_LIBRARY="$device/lib/libddl.so.0"
  export PYTHONPATH="$device/python" PYTHONDONTWRITEBYTECODE=1 DDL_BIN="$device/bin/ddl"
  if ! "$DDL_BIN" --version > /dev/null 2>&1; then  # the device's libstdc++ is older than the build's
    export LD_LIBRARY_PATH="$device/lib/fallback:$LD_LIBRARY_PATH"
    "$DDL_BIN" --version || { echo "device_checks: the carried ddl does not run here" >&2; exit 1; }
  fi
  nvidia-smi -L | tee "$logs/gpus.txt"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tee "$logs/torch.txt"
  one() {  # name, command...: its log in $logs/NAME.log; 0 passed, 77 skipped, else failed
    local name=$1 rc started=$SECONDS
    shift
    (cd tests/integration && timeout 180 "$@") > "$logs/$name.log" 2>&1
    rc=$?
    case $rc in
      0) echo "device_checks: $name passed ($((SECONDS - started)) s)" ;;
      77) echo "device_checks: $name SKIPPED (no GPU)" ;;
      *) echo "device_checks: $name FAILED ($rc); its log's end:"; tail -n 15 "$logs/$name.log"; failed=1 ;;
    esac
    return 0
  }
  # The gpu checks.
  one nccl_collectives "$device/bin/gpu_checks"
  one ddl_torch_gpu "$python" torch_gpu_checks.py
  one torch_backend_gpu "$python" torch_backend_gpu_checks.py
  # Ranks sharing one GPU, where CUDA ops go through host memory (NCCL needs a GPU per rank), and
  # one rank asking for that route.
  for ranks in 2 4; do
    one "shared_gpu_${ranks}_ranks" env CUDA_VISIBLE_DEVICES=0 "$DDL_BIN" run -np "$ranks" --share-gpus -- "$device/bin/gpu_checks" shared
    one "ddl_torch_shared_gpu_${ranks}_ranks" env CUDA_VISIBLE_DEVICES=0 DDL_GPU_CHECK_RANKS="$ranks" "$python" torch_gpu_checks.py
  done
  one cuda_via_host env DDL_CUDA_VIA_HOST=1 "$device/bin/gpu_checks" shared
  # The CPU checks again on this machine's torch 2.x (CI has Debian's 1.13 only), as CPU workers
  # (--cpu: ddl run would otherwise start one worker per GPU, and refuse more). DDL_DEVICE_GPU_ONLY=1
  # skips them and the CPU benchmark, for a session with little device time left.
  local cpu=1
  [ "${DDL_DEVICE_GPU_ONLY:-0}" = 1 ] && cpu=0
  if [ $cpu = 1 ]; then
    one ddl_torch_cpu "$DDL_BIN" run --cpu -np 2 -- "$python" torch_api_checks.py
    one ddl_torch_cpu_fallback env DDL_PYTHON_FASTPATH=0 "$DDL_BIN" run --cpu -np 2 -- "$python" torch_api_checks.py
    one torch_backend_cpu "$DDL_BIN" run --cpu -np 3 -- "$python" torch_backend_checks.py
    one ddp_example_cpu "$DDL_BIN" run --cpu -np 4 --torch-backend ddl -- "$python" ../../examples/pytorch_ddp.py --epochs 2
    one lightning_cpu "$DDL_BIN" run --cpu -np 2 -- "$python" lightning_train.py --backend ddl
    # A real torchrun (Debian's torch 1.13 torchrun fails under Python 3.11 before any worker
    # starts, so CI plays its environment): the ddl backend and ddl.torch take the world from
    # torchrun's variables and store. torch_backend_checks.py imports ddl.distributed itself.
    local torchrun=("$python" -m torch.distributed.run --standalone --nnodes 1)
    one torchrun_backend_cpu env CUDA_VISIBLE_DEVICES= "${torchrun[@]}" --nproc-per-node 3 torch_backend_checks.py
    one torchrun_ddl_torch_cpu env CUDA_VISIBLE_DEVICES= "${torchrun[@]}" --nproc-per-node 2 torch_api_checks.py
  fi
  if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    local gpus
    gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
    one lightning_gpu "$DDL_BIN" run -np "$gpus" -- "$python" lightning_train.py --backend ddl --accelerator gpu
    grep -h "^lightning" "$logs"/lightning_*.log
    timeout 300 "$DDL_BIN" run -np "$gpus" -- "$python" bench/gpu_allreduce_bench.py -e 64M > "$logs/gpu_allreduce_bench.txt" 2>&1 || failed=1
    cat "$logs/gpu_allreduce_bench.txt"
    timeout 300 "$DDL_BIN" run -np "$gpus" -- "$python" bench/gpu_train_step_bench.py > "$logs/gpu_train_step_bench.txt" 2>&1 || failed=1
    cat "$logs/gpu_train_step_bench.txt"
    DDL_TIMELINE="$logs/train_step_timeline.json" timeout 300 "$DDL_BIN" run -np 1 -- "$python" bench/gpu_train_step_bench.py --model many --rounds 1 --steps 30 \
      > "$logs/gpu_train_step_timeline.txt" 2>&1 || failed=1
  fi
  # The Python layer's cost per op (issue 21) on this machine's many idle cores, CPU tensors.
  if [ $cpu = 1 ]; then
    timeout 240 "$python" bench/python_op_cost.py --ddl "$DDL_BIN" --build "$device" --python "$python" --repeat 3 \
      > "$logs/python_op_cost.txt" 2>&1 || failed=1
    cat "$logs/python_op_cost.txt"
  fi
  tar -czf "$out/device-logs.tgz" -C "$logs" .
  echo "device_checks: logs in $out/device-logs.tgz"
  exit $failed
}

case "${1:-}" in
  bundle) bundle ;;
  run) run_checks ;;
  *) echo "usage: bash scripts/device_checks.sh bundle|run" >&2; exit 2 ;;
esac
