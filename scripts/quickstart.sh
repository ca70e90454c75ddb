#!/usr/bin/env bash
# The main-job command of README.md: set up what running needs, build the two programs the main
# job runs, then run it on the embedded default: kiln-pretrain with configs/pretrain/quickstart.yaml
# (the tiny preset on the embedded corpus, about a minute on 2 CPU cores), then a sample from the
# checkpoint it wrote. Arguments go to kiln-pretrain (e.g. --max_steps 100).
#
# Only kiln-pretrain and kiln-generate are built (linking the layers up to train: kiln::core, no
# profiler), into the build folder the test command uses, so
# scripts/test.sh afterwards compiles only what is left: the tests, the other programs and, where
# LibTorch has CUDA, the CUDA kernels and the few sources that call them (lib/CMakeLists.txt,
# kiln_cuda_aware). A new build folder gets no CUDA kernels when no GPU is present;
# KILN_CUDA_KERNELS=ON (or AUTO: when LibTorch has CUDA) builds them anyway, OFF never.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
build="${KILN_BUILD_DIR:-$root/build${KILN_CUDA:+-cu$KILN_CUDA}}"
configure=()
if [[ -n "${KILN_CUDA_KERNELS:-}" ]]; then
  configure=(-DKILN_CUDA="$KILN_CUDA_KERNELS")
elif [[ ! -f "$build/CMakeCache.txt" ]]; then
  # A new build folder: the library and the two programs only (the tests are configured by the
  # test command), without the CUDA kernels unless a GPU is here to run them.
  kernels=OFF
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    kernels=AUTO
  else
    echo "[quickstart] no GPU: building without the CUDA kernels (KILN_CUDA_KERNELS=ON builds them)"
  fi
  configure=(-DKILN_CUDA="$kernels" -DKILN_BUILD_TESTS=OFF)
fi
# kiln-pretrain first and run at once; kiln-generate (one file more) after the training.
KILN_BUILD_DIR="$build" KILN_BUILD_TARGETS="kiln-pretrain" "$root/scripts/build.sh" "${configure[@]}"
bin="$build/bin"
"$bin/kiln-pretrain" --output_dir output/quickstart "$@"
KILN_BUILD_DIR="$build" KILN_BUILD_TARGETS="kiln-generate" "$root/scripts/build.sh" >/dev/null
ckpt="$(ls -d output/quickstart/checkpoint-* | sort -t- -k2 -n | tail -n 1)"
echo "--- sample from $ckpt (kiln-generate --greedy):"
"$bin/kiln-generate" --model "$ckpt" --prompt "The " --max-new-tokens 120 --greedy
