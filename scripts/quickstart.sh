#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job — real data-parallel
# PyTorch training with 4 workers on this machine, started and supervised by `ddl run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec build/cli/ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py "$@"
