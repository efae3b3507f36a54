#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, build, and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --for-tests
bash scripts/lightning_venv.sh  # PyTorch Lightning for the Lightning tests (a cached venv; quick when present)
bash scripts/tf_venv.sh keras2  # TensorFlow 2.15 + Keras 2 for the ddl.tensorflow/ddl.keras tests (cached venv)
bash scripts/tf_venv.sh keras3  # TensorFlow 2.21 + Keras 3, likewise
bash scripts/check_format.sh    # every C and C++ file as .clang-format has it
# The sanitizer builds (clang) compile at the lowest priority while the main tests run.
bash scripts/install_packages.sh clang-14 libclang-rt-14-dev
setsid nice -n 19 bash scripts/sanitizers.sh --build-only >build/sanitizer-builds.log 2>&1 &
sanitizer_builds=$!
trap 'kill -- -$sanitizer_builds 2>/dev/null || true' EXIT
ctest --test-dir build --output-on-failure -j 2  # two lanes: tests that compile ddl beside the rest (tests/CMakeLists.txt)
wait "$sanitizer_builds" || { tail -50 build/sanitizer-builds.log; echo "test.sh: the sanitizer builds failed (build/sanitizer-builds.log)"; exit 1; }
trap - EXIT
echo "test.sh: the main tests passed after ${SECONDS} s"
# The C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer.
exec bash scripts/sanitizers.sh
