#!/usr/bin/env bash
# The main-job command of README.md: set up, build, then run the main job on the embedded default.
# Until kiln-pretrain lands this is kiln-smoke: the tiny preset trained for 60 steps on CPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
exec "${KILN_BUILD_DIR:-$root/build}/bin/kiln-smoke" "$@"
