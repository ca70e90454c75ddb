#!/usr/bin/env bash
# Configures and builds kiln into ${KILN_BUILD_DIR:-build} (build-cu12 with KILN_CUDA=12).
#
#   scripts/build.sh [CMAKE CONFIGURE ARGS...]    e.g. scripts/build.sh -DKILN_CUDA=OFF
#
# CMake configures when the build folder is new or when the arguments differ from the last
# configure's; otherwise the build folder keeps its configuration. KILN_BUILD_TARGETS names the
# targets to build (all by default; scripts/quickstart.sh builds only the programs it runs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/env.sh"
build="${KILN_BUILD_DIR:-$root/build${KILN_CUDA:+-cu$KILN_CUDA}}"
jobs="${KILN_JOBS:-$(nproc)}"
args_file="$build/kiln-configure-args.txt"
if [[ ! -f "$build/CMakeCache.txt" || ($# -gt 0 && "$*" != "$(cat "$args_file" 2>/dev/null)") ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} "$@"
  printf '%s' "$*" >"$args_file"
fi
targets=()
for t in ${KILN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"
