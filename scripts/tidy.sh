#!/usr/bin/env bash
# clang-tidy 14 with the checked-in .clang-tidy over every C and C++ file of the project that the
# build compiles (build-tidy/compile_commands.json: configured without unity batches, so that each
# file has its own command); any finding fails. About 3.5 minutes on 2 cores, so it is run before a
# commit that touches C++ (not by the README's test command, which checks the formatting only):
# `bash scripts/tidy.sh [FILE...]` (default: all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_packages.sh clang-tidy-14
[ -f build/compile_commands.json ] || bash scripts/setup.sh --for-tests
# A configured (not built) tree without unity batches: one compile command per source file.
cmake -S . -B build-tidy -DDDL_UNITY_BUILD=OFF -DBUILD_TESTING=ON >/dev/null
root=$PWD
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(python3 -c "
import json, os
for e in json.load(open('build-tidy/compile_commands.json')):
    f = os.path.relpath(e['file'])
    if not f.startswith(('build', '..')): print(f)")
fi
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy-14 -p build-tidy --quiet 2>/dev/null | sed "s#$root/##" > build/tidy.log || true
if grep -q "error:\|warning:" build/tidy.log; then
  grep "error:\|warning:" build/tidy.log | sed 's/\x1b\[[0-9;]*m//g' >&2
  echo "tidy: findings above (build/tidy.log)" >&2
  exit 1
fi
echo "tidy: ${#files[@]} files clean"
