#!/usr/bin/env bash
# The code stays formatted by .clang-format: lists every tracked C or C++ file that clang-format 14
# (Debian's clang-format-14) would change and fails if there is any. `bash scripts/check_format.sh
# --fix` formats them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_packages.sh clang-format-14
mapfile -t files < <(git ls-files '*.c' '*.cpp' '*.h' '*.hpp')
if [ "${1:-}" = "--fix" ]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "check_format: not formatted by .clang-format (run: bash scripts/check_format.sh --fix): ${unformatted[*]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
