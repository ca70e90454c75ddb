#!/usr/bin/env bash
# Fuzzes kiln's readers of checkpoint files with libFuzzer (docs/formats.md, "Hostile files"):
# builds tests/fuzz/libfuzzer with clang (coverage, AddressSanitizer + UndefinedBehaviorSanitizer,
# LeakSanitizer) into BUILD/fuzz, writes seed inputs (scripts/fuzz_seeds.py: files written by
# torch.save, transformers, safetensors; and kiln's own checkpoint when BUILD/bin/kiln-pretrain
# exists), then runs each harness for SECONDS. Fails on the first crash, leak, timeout (10 s an
# input) or an input above 2 GB of memory; the reproducer is left in BUILD/fuzz/artifacts/. What
# earlier runs found (tests/fuzz/libfuzzer/regressions/<harness>/) is run first, every time.
#
#   scripts/fuzz.sh [--seconds N | --runs N] [--build-dir BUILD] [--keep-corpus]
#
# --runs N: N inputs a harness from libFuzzer's seed 1, the same mutations each run (what the
# default suite runs, so that its outcome does not depend on the machine's speed or the hour);
# --seconds N: N seconds a harness from a random seed (new inputs each time).
# CTest runs it twice: `fuzz` (--runs 60000, the default suite) and `fuzz_slow` ([slow], 10
# minutes a harness, the corpus kept in BUILD/fuzz/corpus between runs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds=20
runs=0
build="${KILN_BUILD_DIR:-$root/build}"
keep=0
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --keep-corpus) keep=1; shift ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$root/scripts/env.sh"
clangxx="$(command -v clang++-14 || command -v clang++ || true)"
if [[ -z "$clangxx" ]]; then
  echo "fuzz.sh: clang++ not found (scripts/setup.sh --tests installs clang-14 and libclang-rt-14-dev)" >&2
  exit 1
fi
fuzz="$build/fuzz"
mkdir -p "$fuzz"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ ! -f "$fuzz/build.ninja" ]]; then
  cmake -S "$root/tests/fuzz/libfuzzer" -B "$fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$clangxx" -DTorch_DIR="$Torch_DIR" "${launcher[@]}" >/dev/null
fi
cmake --build "$fuzz" -- -j "$(nproc)"

# Seeds: written fresh each run (they depend on the installed torch / transformers).
seeds="$fuzz/seeds"
rm -rf "$seeds"
kiln_ckpt=()
if [[ -x "$build/bin/kiln-pretrain" ]]; then
  out="$fuzz/kiln-run"
  rm -rf "$out"
  timeout 300 "$build/bin/kiln-pretrain" --config "$root/configs/pretrain/quickstart.yaml" --max_steps 2 --save_steps 2 \
    --eval_steps 0 --logging_steps 1 --fp16 true --output_dir "$out" >/dev/null 2>&1 &&
    kiln_ckpt=(--kiln-checkpoint "$out/checkpoint-2")
fi
"$KILN_PYTHON" "$root/scripts/fuzz_seeds.py" "$seeds" "${kiln_ckpt[@]}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
mkdir -p "$fuzz/artifacts"
status=0
for h in fuzz_pt_file fuzz_torch_pickle fuzz_safetensors fuzz_state_json; do
  found=()
  [[ -d "$root/tests/fuzz/libfuzzer/regressions/$h" ]] && found=("$root/tests/fuzz/libfuzzer/regressions/$h")
  corpus="$fuzz/corpus/$h"
  ((keep)) || rm -rf "$corpus"
  mkdir -p "$corpus"
  log="$fuzz/$h.log"
  start=$SECONDS
  budget=(-max_total_time="$seconds")
  ((runs > 0)) && budget=(-runs="$runs" -seed=1)
  # (bounded twice: libFuzzer's own budget, and `timeout` should a run never reach it)
  if timeout $((seconds > 0 && runs == 0 ? seconds + 300 : 900)) "$fuzz/$h" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$fuzz/artifacts/$h-" "$corpus" "$seeds/$h" "${found[@]}" \
      >"$log" 2>&1; then
    count=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    outcome=$(grep -a -o 'kiln-fuzz: [0-9]* loaded, [0-9]* refused' "$log" | tail -1 | cut -c12- || true)
    echo "fuzz $h: $count inputs in $((SECONDS - start)) s ($outcome), no crash ($cov, corpus $(ls "$corpus" | wc -l) inputs)"
  else
    status=1
    echo "fuzz $h: FAILED (log $log, reproducer in $fuzz/artifacts/)"
    grep -E "ERROR|SUMMARY|==[0-9]+==|Test unit written|uncaught" "$log" | head -20
  fi
done
exit "$status"
