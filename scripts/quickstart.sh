#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job — real data-parallel
# training with 4 workers on this machine, started and supervised by `ddl run`: PyTorch DDP
# (gloo), the ALCF tutorial's Horovod script on ddl.torch (libddl from Python), then a C++ MLP
# whose gradients libddl averages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== PyTorch DDP, 4 workers: ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py"
build/cli/ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py
echo "== Horovod-style PyTorch on ddl.torch, 4 workers: ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" build/cli/ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py
echo "== C++ on libddl, 4 workers: ddl run -np 4 -- build/examples/cpp_train"
build/cli/ddl run -np 4 -- build/examples/cpp_train
