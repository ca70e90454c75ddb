#!/usr/bin/env bash
# The test command of README.md (and of .ci/run): set up, build, then run the suite through CTest
# (C++ tests, format and public-API checks, the short stop-path soak; [cuda] tests report
# "skipped" without a GPU; [slow] tests are off).
#
#   scripts/test.sh [CTEST ARGS...]      the default suite in build/
#   scripts/test.sh --sanitize [ARGS]    a CPU build with AddressSanitizer + UndefinedBehaviorSanitizer
#                                        in build-sanitize/: the default suite, then the stop-path soak
#                                        on those binaries (docs/training.md, "Stopping")
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ "${1:-}" == "--sanitize" ]]; then
  shift
  export KILN_BUILD_DIR="${KILN_BUILD_DIR:-$root/build-sanitize}"
  "$root/scripts/setup.sh" --tests
  "$root/scripts/build.sh" -DKILN_CUDA=OFF -DKILN_SANITIZE=ON -DKILN_BUILD_TESTS=ON
  source "$root/scripts/env.sh"
  # LibTorch leaks its singletons at exit by design; the CUDA runtime (loaded by the CUDA build of
  # LibTorch even here) maps memory where ASan's shadow gap would be; the first UB report fails.
  export ASAN_OPTIONS="detect_leaks=0:protect_shadow_gap=0:abort_on_error=1:${ASAN_OPTIONS:-}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
  export KILN_SANITIZED=1  # tests that bound RSS or wall time relax those bounds (ASan's shadow, ~2-3x slower)
  cd "$KILN_BUILD_DIR"
  # Not here: the format and API checks (the same sources as the default build), the installed
  # package (an outside build without the sanitizer runtime), and the soak's CTest entry, whose
  # glibc malloc checking cannot run beside ASan's allocator: the soak runs below instead.
  ctest --output-on-failure --timeout 2400 -E "^(clang_format|public_api|consumer|soak_stops)$" "$@"
  "$KILN_PYTHON" "$root/scripts/soak_stops.py" --build-dir "$KILN_BUILD_DIR" --term 20 --int 8 --kill 8 --ddp 2 \
    --tokenize 2 --max-exit-seconds 30
  exit 0
fi
"$root/scripts/setup.sh" --tests
# The build folder scripts/quickstart.sh builds into: what it compiled is reused; the tests, the
# other programs and (where LibTorch has CUDA) the CUDA kernels are added.
"$root/scripts/build.sh" -DKILN_CUDA=AUTO -DKILN_BUILD_TESTS=ON
cd "${KILN_BUILD_DIR:-$root/build${KILN_CUDA:+-cu$KILN_CUDA}}"
ctest --output-on-failure --timeout 1200 "$@"
