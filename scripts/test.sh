#!/usr/bin/env bash
# The test command of README.md (and of .ci/run): set up, build, then run the suite through CTest
# (C++ tests, format check; [cuda] tests report "skipped" without a GPU; [slow] tests are off).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${KILN_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 1200 "$@"
