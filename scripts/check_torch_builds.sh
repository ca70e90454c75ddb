#!/usr/bin/env bash
# Builds kiln and runs its default suite against each LibTorch build set-up can choose, each in
# its own build folder, and prints one Markdown line per build: LibTorch, nvcc, set-up / build /
# test minutes, the CTest result. (README.md "V100 and CUDA 12"; docs/kernels.md says which
# combinations are tested.) On a machine without a GPU this is the CPU suite ([cuda] tests skip).
#
#   scripts/check_torch_builds.sh            both: KILN_CUDA=13 (torch 2.11.0) and 12 (torch 2.10.0)
#   scripts/check_torch_builds.sh 12         one
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
majors=("$@")
((${#majors[@]})) || majors=(13 12)
status=0
lines=()
# A forced KILN_CUDA makes set-up record its choice as the default (selected.env); this check must
# leave the machine's own default as it found it.
home="${KILN_HOME:-$HOME/.cache/kiln}"
[[ -f "$home/selected.env" ]] && cp "$home/selected.env" "$home/selected.env.check-torch-builds"
restore() { [[ -f "$home/selected.env.check-torch-builds" ]] && mv "$home/selected.env.check-torch-builds" "$home/selected.env"; }
trap restore EXIT
for m in "${majors[@]}"; do
  build="$root/build-cu$m"
  log="$build.log"
  t0=$SECONDS
  KILN_CUDA=$m "$root/scripts/setup.sh" --tests >"$log" 2>&1 || { lines+=("| CUDA $m | set-up failed: $log |"); status=1; continue; }
  t1=$SECONDS
  KILN_CUDA=$m KILN_BUILD_DIR="$build" bash -c "source '$root/scripts/env.sh' && '$root/scripts/build.sh'" >>"$log" 2>&1 ||
    { lines+=("| CUDA $m | build failed: $log |"); status=1; continue; }
  t2=$SECONDS
  (cd "$build" && ctest --timeout 1200 --output-on-failure) >>"$log" 2>&1 || status=1
  t3=$SECONDS
  nvcc_version="$(grep -m1 'CMAKE_CUDA_COMPILER_VERSION' "$build/CMakeFiles/"*/CMakeCUDACompiler.cmake 2>/dev/null | sed 's/.*"\(.*\)".*/\1/')"
  result="$(grep -E 'tests passed|tests failed' "$log" | tail -1)"
  lines+=("| CUDA $m | $(sed -n 's/^KILN_TORCH_VERSION=//p' <(KILN_CUDA=$m "$root/scripts/choose_torch.sh" 2>/dev/null)) | nvcc ${nvcc_version:-?} | $(((t1 - t0) / 60)) / $(((t2 - t1) / 60)) / $(((t3 - t2) / 60)) min | $result |")
done
echo "| build | torch | toolkit | set-up / build / tests | CTest |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${lines[@]}"
exit $status
