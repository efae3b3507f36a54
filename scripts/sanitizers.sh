#!/usr/bin/env bash
# The README's test command runs this after the main tests: the unit tests and the C++ collective,
# supervision and store tests again, built with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/). Any report fails the run. The Python tests are left out: a Python interpreter
# cannot load an ASan-built libddl. NCCL is off in this build (no GPU here to exercise it).
# Known third-party noise is suppressed in tests/sanitizers/*.supp, each entry with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDDL_SANITIZE=address,undefined -DDDL_WITH_NCCL=OFF >/dev/null
cmake --build build-asan -j "$(nproc)" --target ddl_unit_tests collective_checks ddl cpp_train ddl_rendezvous_bench \
  -- --no-print-directory >/dev/null
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec ctest --test-dir build-asan --output-on-failure -j 1 \
  -R '^(unit|integration\.(collectives|supervision|concurrency_and_store))$'
