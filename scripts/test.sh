#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, build, and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec ctest --test-dir build --output-on-failure -j 1
