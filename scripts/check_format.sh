#!/usr/bin/env bash
# Fails when a C++/CUDA source differs from .clang-format; `--fix` rewrites the files instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- 'lib/*' 'apps/*' 'tests/*' |
  grep -E '\.(h|hpp|cpp|cu|cuh|cpp\.in)$' | grep -v '\.in$')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files clean"
