#!/usr/bin/env bash
# Configures (once) and builds kiln into ${KILN_BUILD_DIR:-build} (build-cu12 with KILN_CUDA=12). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DKILN_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/env.sh"
build="${KILN_BUILD_DIR:-$root/build${KILN_CUDA:+-cu$KILN_CUDA}}"
jobs="${KILN_JOBS:-$(nproc)}"
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} "$@"
fi
cmake --build "$build" -j "$jobs"
