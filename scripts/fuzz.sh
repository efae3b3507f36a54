#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (clang 14, -fsanitize=fuzzer,address,undefined, in
# build-fuzz/) and runs each on its seed corpus for DDL_FUZZ_SECONDS seconds (default 20) as the
# ctest tests labelled `fuzz`. A crash, sanitizer report, leak, hang or unexpected exception fails
# the run; the input that caused it is kept in build-fuzz/tests/fuzz/<target>/artifacts/.
# docs/fuzzing.md says what each harness covers and how to run one longer.
#
#   DDL_FUZZ_SECONDS=300 bash scripts/fuzz.sh    # longer runs
#   DDL_FUZZ_JOBS=1 bash scripts/fuzz.sh         # one compiler / one fuzzer at a time (default: nproc)
#
# The project's other packages come from scripts/setup.sh; this installs only clang 14 and its
# libFuzzer runtime when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_packages.sh clang-14 libclang-rt-14-dev

seconds=${DDL_FUZZ_SECONDS:-20}
jobs=${DDL_FUZZ_JOBS:-$(nproc)}
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDDL_FUZZ=ON -DDDL_FUZZ_SECONDS="$seconds" -DDDL_WITH_NCCL=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target ddl_fuzzers -- --no-print-directory >/dev/null
echo "fuzz: ${seconds}s per target"
exec ctest --test-dir build-fuzz -L fuzz --output-on-failure -j "$jobs"
