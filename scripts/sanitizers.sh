#!/usr/bin/env bash
# The README's test command runs this after the main tests. One clang 14 build (build-sanitizers/)
# with AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's coverage (DDL_FUZZ=ON) runs:
#   - the unit tests and the C++ collective, supervision and store tests again;
#   - every fuzz harness of tests/fuzz for DDL_FUZZ_SECONDS (default 15) on its seed corpus.
# A ThreadSanitizer build (build-tsan/) runs the tests of the threaded parts in one process beside the
# fuzzers: the engine (its background thread, N ranks as threads), the store server and client, the C++ API.
# Any report, crash or leak fails the run. The Python tests are left out: a Python interpreter
# cannot load an ASan-built libddl. NCCL is off in this build (no GPU here to exercise it).
# Known third-party noise is suppressed in tests/sanitizers/*.supp, each entry with its reason.
# Longer fuzzing: scripts/fuzz.sh (docs/fuzzing.md). With --build-only: the two builds, no runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/install_packages.sh clang-14 libclang-rt-14-dev  # only clang has libFuzzer

# -O1, as the sanitizers' authors advise: the instrumented tests run several times faster than at
# -O0, with every report and assert (a Debug build) kept.
optimized_debug=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1")
CC=clang-14 CXX=clang++-14 cmake -S . -B build-sanitizers "${optimized_debug[@]}" -DDDL_FUZZ=ON \
  -DDDL_FUZZ_SECONDS="${DDL_FUZZ_SECONDS:-15}" -DDDL_WITH_NCCL=OFF >/dev/null
cmake --build build-sanitizers -j "$(nproc)" --target ddl_unit_tests collective_checks ddl cpp_train ddl_rendezvous_bench \
  ddl_fuzzers -- --no-print-directory >/dev/null
CC=clang-14 CXX=clang++-14 cmake -S . -B build-tsan "${optimized_debug[@]}" -DDDL_SANITIZE=thread -DDDL_WITH_NCCL=OFF >/dev/null
cmake --build build-tsan -j "$(nproc)" --target ddl_thread_tests -- --no-print-directory >/dev/null
[ "${1:-}" = --build-only ] && exit 0  # scripts/test.sh builds both while the main tests run
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-sanitizers --output-on-failure -j 1 -R '^(unit|integration\.(collectives|supervision|concurrency_and_store))$'

# The fuzzers keep one core busy each for DDL_FUZZ_SECONDS; the ThreadSanitizer tests mostly wait
# (their timeouts): the two run side by side, the latter's report kept in build-tsan/tests.log.
echo "sanitizers: ThreadSanitizer on the engine, store and C++ API tests (beside the fuzzers)"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp" \
  build-tsan/tests/ddl_thread_tests >build-tsan/tests.log 2>&1 &
thread_tests=$!
fuzzers_rc=0
ctest --test-dir build-sanitizers --output-on-failure -j 1 -R '^fuzz\.' || fuzzers_rc=$?
thread_tests_rc=0
wait "$thread_tests" || thread_tests_rc=$?
tail -3 build-tsan/tests.log
if ((thread_tests_rc)); then
  cat build-tsan/tests.log
  echo "sanitizers: the ThreadSanitizer tests failed (exit $thread_tests_rc; build-tsan/tests.log)"
fi
exit $((fuzzers_rc || thread_tests_rc))
