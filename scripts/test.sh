#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, build, and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --for-tests
bash scripts/lightning_venv.sh  # PyTorch Lightning for the Lightning tests (a cached venv; quick when present)
bash scripts/tf_venv.sh keras2  # TensorFlow 2.15 + Keras 2 for the ddl.tensorflow/ddl.keras tests (cached venv)
bash scripts/tf_venv.sh keras3  # TensorFlow 2.21 + Keras 3, likewise
bash scripts/check_format.sh    # every C and C++ file as .clang-format has it
ctest --test-dir build --output-on-failure -j 1
# The C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
exec bash scripts/sanitizers.sh
