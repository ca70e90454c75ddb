#!/usr/bin/env bash
# The GPU check, in one script for a machine with an NVIDIA GPU, CUDA 13, CMake, ninja and a
# python3 with torch 2.11 (cu130), but none of kiln's Debian packages and no network:
#   1. configure against .deps/usr (made here by scripts/bundle_deps.sh and carried along) and
#      torch's own CMake package, build kiln for this GPU's architecture with -Xptxas -v;
#   2. run the [cuda] tests, again on the kernels' Volta code paths (KILN_KERNEL_ARCH=70: what a
#      V100 runs); the CPU tests are CI's;
#   3. hardware counters (lib/kiln/profile/counters.h): the [counters] tests (CUPTI over a copy, a
#      bf16 matmul and 500 small kernels, one range over each interval and one per kernel; the
#      perf_event session) and the [component_times] test (GPU time per component through Kineto),
#      kiln-profile --counters on the tiny preset (one range; per kernel under kernel replay and
#      under user replay), llama-100m without counters but with --component-times, then
#      --counter-phases over llama-100m (bf16, cutoff_len 1024 x batch 8: forward, backward and
#      optimizer counted apart) and --counters over
#      llama-3.2-1b (configs/profile/llama-3.2-1b.yaml: fp32, 1024 x 16), one counted step each:
#      each point's counted memory bandwidth, tensor core and fp engine beside the modelled ones;
#      last, on the time left, the [per_component] test (tiny counted per kernel, each kernel's
#      component at its launch: the per-component table's counted bytes);
#   4. run kiln-bench (the fused ops, kiln vs ATen; fp16 both ways), then scripts/bench_vs_hf.py: kiln's
#      training step against transformers' on this GPU, bf16, llama-100m at cutoff_len 1024 (batch 8)
#      and 8192 (batch 1) and llama-3.2-1b at 2048 (batch 4), alternated over up to 2 rounds (no new
#      round after 60 s), after a parity check of parameter count and loss (and, below 300M
#      parameters, every gradient); transformers comes from .deps/python when python3 lacks it;
#   5. run kiln-bench --ops attention (kiln's flash attention vs SDPA flash and cuDNN, T 512..8192,
#      head dims 64/128, 3 timed iterations; then fp16 at head dim 64 on the Volta kernels);
#   6. data parallel on NCCL with world size 1 under torchrun (kiln-pretrain, 40 bf16 steps of the
#      quick start, stage 0 and 2) and kiln-bench --ops comm (NCCL bus bandwidth, 1 MiB..1 GiB).
# The steps run in that order: what is worth most first, so that a budget cut takes the least.
# Every file goes to a work folder (device_work/): env.log, build.log, ptxas.txt, tests.log (both
# test runs), bench.{md,json}, bench_vs_hf.{md,json}, bench_attention.{md,json}, dist.log,
# bench_comm.{md,json}, counters.log, profile_{tiny,tinyk,tinyu,100m_plain,100m,1b}.{md,json}, stalls.log; when the script
# ends, $OUT (the device tool's result folder, which returns at most 8 files; ./device_out
# elsewhere) gets them as device_results.tar.gz and the summary printed last as summary.txt.
# Each step has its own time limit, cut to what is left of the script's budget
# (KILN_DEVICE_BUDGET_S, 540 s by default), and a failed or skipped step does not stop the later
# ones. A step that runs out of time is first looked at (stalls.log: each thread's state, CPU time
# and kernel wait channel twice, 2 s apart, the GPU's utilisation, and gdb's backtraces where gdb
# exists), then stopped. KILN_DEVICE_ONLY="counters" (a list of: tests counters bench attention dist) runs only those
# steps after the build, and builds only what they run.
#
# The build: on the GPU machine itself (a few minutes of its 16 cores), or none where .deps/prebuilt
# holds programs built here for it (scripts/bundle_deps.sh --prebuilt BUILD_DIR: a build folder
# configured with -DKILN_CUDA=ON -DKILN_BUILD_TESTS=ON -DKILN_PARQUET=OFF
# -DCMAKE_CUDA_ARCHITECTURES=90): they load the GPU machine's own LibTorch (the same torch 2.11.0
# wheel) and the carried libraries; if they cannot start there, the script builds after all.
# With the device tool:
#   run(command="scripts/device_check.sh", carry=[".deps"], timeout_s=600)
#   run(command="KILN_DEVICE_ONLY=counters scripts/device_check.sh", carry=[".deps"], timeout_s=600)
# `scripts/device_check.sh --configure-only` stops after step 1's configure (a check that the
# bundle is complete, runnable on any machine).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
results="${OUT:-$root/device_out}"
out="$root/device_work"
rm -rf "$out"
mkdir -p "$out" "$results"
deps="$root/.deps/usr"
build="$root/build-device"
arch="${KILN_DEVICE_ARCH:-90}"
log="$out/env.log"
status=0
budget="${KILN_DEVICE_BUDGET_S:-540}"
only="${KILN_DEVICE_ONLY:-}"

# The summary (printed, and $OUT/summary.txt) and every file as one archive, however the script ends.
summary() {
  grep -E "^(== |All tests passed|test cases:|assertions:|device_check:|FAILED|.*: FAILED:)" "$out/tests.log" \
    "$out/counters.log" 2>/dev/null
  grep -h "^device_check: exit status" "$log" 2>/dev/null
  grep -hE "(copy|matmul): |small kernels in |phase one |per component: | MB counted, " "$out/counters.log" \
    2>/dev/null | sort -u
  grep -hE "^(\||counters:|# |peak:|roofline|kiln-profile: cutoff_len)" "$out"/profile_*.md 2>/dev/null
  grep -hE "^== |^stall:" "$out/stalls.log" 2>/dev/null | head -n 60
  cat "$out/bench.md" 2>/dev/null
  if grep -q "^## kiln" "$out/bench_attention.md" 2>/dev/null; then
    grep -h "^WARNING: T=" "$out/bench_attention.md"
    sed -n '/^## kiln/,$p' "$out/bench_attention.md"
  else
    tail -n 12 "$out/bench_attention.md" 2>/dev/null
  fi
  grep -E "^(\||# kiln vs|bench_vs_hf:)" "$out/bench_vs_hf.md" 2>/dev/null
  grep -E "^(== |  Distributed|kiln-pretrain:|\{'loss')" "$out/dist.log" 2>/dev/null
  tail -n 9 "$out/bench_comm.md" 2>/dev/null
  echo "device_check: ended after ${SECONDS}s, exit status $1"
}
finish() {
  local rc=$?
  summary "$rc" | tee "$results/summary.txt"
  tar -C "$out" -czf "$results/device_results.tar.gz" .
}
trap finish EXIT

# Whether step group $1 runs (all of them unless KILN_DEVICE_ONLY names some).
want() { [[ -z "$only" || " $only " == *" $1 "* ]]; }

# Seconds step may run: its own limit $1, cut to what is left of the budget (0: no time left).
limit() {
  local left=$((budget - SECONDS))
  ((left < 0)) && left=0
  echo $((left < $1 ? left : $1))
}
# What a process that ran out of time is doing (stalls.log): per thread of it and of its children,
# state, user and system CPU ticks and wait channel, twice 2 s apart (growing ticks: busy; the
# same: blocked, the wait channel says on what); the GPU's utilisation; gdb's backtraces if any.
diagnose() {
  local pid=$1 p t round
  shift
  {
    echo "== stall after ${SECONDS}s: $*"
    for round in 1 2; do
      for p in $pid $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
        for t in /proc/"$p"/task/*; do
          [[ -r "$t/stat" ]] || continue
          # stat: pid (comm) state ... utime(14) stime(15); comm may hold spaces, so cut after ')'.
          echo "stall: round $round pid $p tid ${t##*/} $(cut -d')' -f1 "$t/stat" | cut -d'(' -f2)" \
            "$(cut -d')' -f2- "$t/stat" | awk '{print "state", $1, "utime", $12, "stime", $13}')" \
            "wchan $(cat "$t/wchan" 2>/dev/null)"
        done
      done
      ((round == 1)) && sleep 2
    done
    nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,power.draw --format=csv 2>&1 | sed 's/^/stall: /'
    if command -v gdb >/dev/null; then
      timeout 30 gdb -p "$pid" -batch -ex "thread apply all bt 12" 2>&1 | grep -E "^(Thread|#)" | head -n 200
    else
      echo "stall: no gdb here for backtraces"
    fi
  } >>"$out/stalls.log" 2>&1
}
# Runs "$@" with limit $1 (seconds), or records that no time was left for it. Past the limit the
# process is diagnosed, then sent SIGTERM, and SIGKILL 5 s later.
step() {
  local secs
  secs="$(limit "$1")"
  shift
  if ((secs < 10)); then
    echo "device_check: no time left for: $*" | tee -a "$log"
    return 124
  fi
  "$@" &
  local pid=$! waited=0 rc
  while kill -0 "$pid" 2>/dev/null && ((waited < secs)); do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    diagnose "$pid" "$@"
    kill -TERM "$pid" 2>/dev/null
    sleep 5
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=124
  else
    wait "$pid"
    rc=$?
  fi
  # A program that dies by a signal leaves no message of its own: say how each step ended.
  if ((rc == 124)); then
    echo "device_check: exit status 124 (timed out after ${secs}s): $*" | tee -a "$log" >&2
  elif ((rc != 0)); then
    echo "device_check: exit status $rc: $*" | tee -a "$log" >&2
  fi
  return $rc
}

if [[ ! -d "$deps" ]]; then
  echo "device_check: $deps missing: run scripts/bundle_deps.sh here and carry .deps" | tee -a "$log"
  exit 2
fi
py="${KILN_DEVICE_PYTHON:-python3}"
{
  date
  nvidia-smi || true
  nvcc --version || true
  cmake --version | head -1
  "${KILN_DEVICE_PYTHON:-python3}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >>"$log" 2>&1

# The carried pkg-config files name /usr as prefix; point them at the bundle.
find "$deps" -name '*.pc' -exec sed -i "s|^prefix=.*|prefix=$deps|" {} +
multi="$deps/lib/x86_64-linux-gnu"
export PATH="$deps/bin:$PATH"
export LD_LIBRARY_PATH="$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$multi/pkgconfig:$deps/share/pkgconfig"
torch_dir="$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
Torch_DIR="$torch_dir/share/cmake/Torch"

# Programs built elsewhere: this machine's LibTorch (and the wheel's CUDA libraries, CUPTI among
# them) and the carried libraries on the search path, and the checkout they were built from (its
# test fixtures) linked to this one. They are used when they start; else the build below runs.
prebuilt="$root/.deps/prebuilt"
use_prebuilt=0
if [[ -x "$prebuilt/tests/kiln_tests" && "${1:-}" != "--configure-only" ]]; then
  export LD_LIBRARY_PATH="$prebuilt/lib:$torch_dir/lib:$(dirname "$torch_dir")/nvidia/cu13/lib:$LD_LIBRARY_PATH"
  src="$(cat "$prebuilt/source_root")"
  if [[ "$src" != "$root" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
  fi
  {
    echo "== prebuilt programs (.deps/prebuilt, built at $src)"
    ldd "$prebuilt/tests/kiln_tests" | grep -E "not found|torch|cupti|cudart|kiln" || true
  } >>"$log" 2>&1
  # (Catch2's --list-tests exits with the number of tests it lists.)
  "$prebuilt/tests/kiln_tests" --list-tests "[cuda]" >"$out/cuda_tests.txt" 2>&1
  cat "$out/cuda_tests.txt" >>"$log"
  if grep -q "matching test case" "$out/cuda_tests.txt" && "$prebuilt/bin/kiln-profile" --help >/dev/null 2>>"$log"; then
    use_prebuilt=1
    build="$prebuilt"
    echo "device_check: using the prebuilt programs" | tee -a "$log"
  else
    echo "device_check: the prebuilt programs do not start here (env.log): building" | tee -a "$log"
  fi
fi

# 1. configure + build (explicit package folders: the machine's CMake may not search multiarch paths)
if ((use_prebuilt)); then
  :
else
step 150 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$Torch_DIR" \
  -DCMAKE_PREFIX_PATH="$deps" -DKILN_FETCH_MISSING=OFF -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DKILN_PTXAS_VERBOSE=ON -DKILN_PYTHON= -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkgconf" \
  -Dfmt_DIR="$multi/cmake/fmt" -Dspdlog_DIR="$multi/cmake/spdlog" -Dyaml-cpp_DIR="$multi/cmake/yaml-cpp" \
  -Dbenchmark_DIR="$multi/cmake/benchmark" -Dcxxopts_DIR="$deps/lib/cmake/cxxopts" \
  -DCatch2_DIR="$deps/lib/cmake/Catch2" -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >>"$log" 2>&1 ||
  { echo "device_check: configure failed (env.log)" | tee -a "$log"; exit 1; }
if [[ "${1:-}" == "--configure-only" ]]; then
  echo "device_check: configured $build"
  trap - EXIT
  exit 0
fi
targets=()
if [[ -n "$only" ]]; then
  want tests || want counters && targets+=(--target kiln_tests)
  want bench || want attention || want dist && targets+=(--target kiln-bench)
  want bench && targets+=(--target kiln-profile --target kiln-hf)
  want dist && targets+=(--target kiln-pretrain)
  want counters && targets+=(--target kiln-profile)
fi
step 330 cmake --build "$build" -j "$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1 ||
  { echo "device_check: build failed (build.log)"; status=1; }
grep -E "Compiling entry|registers|spill" "$out/build.log" >"$out/ptxas.txt" || true
fi

# 2. tests (one log, each run under a "== " heading)
if want tests && [[ -x "$build/tests/kiln_tests" ]]; then
  echo "== [cuda] tests" >"$out/tests.log"
  step 100 "$build/tests/kiln_tests" --kiln-require-cuda "[cuda]" -d yes >>"$out/tests.log" 2>&1 || status=1
  # The same [cuda] tests on the kernels' Volta (sm_70) code paths: fp16 tiles without cp.async,
  # shared memory planned for a V100's 96 KiB (bf16 and head dim 128 then take ATen's path).
  echo "== [cuda] tests, Volta code paths (KILN_KERNEL_ARCH=70)" >>"$out/tests.log"
  step 80 env KILN_KERNEL_ARCH=70 "$build/tests/kiln_tests" --kiln-require-cuda "[cuda]" >>"$out/tests.log" 2>&1 ||
    status=1
fi

# 3. hardware counters: the [counters] tests (their figures as warnings), kiln-profile on the tiny
# preset three ways (one range; per kernel, kernel replay; per kernel, user replay: what a counted
# step costs each way), then the 100M point without counters, the 100M point counted per phase
# (--counter-phases: forward, backward, optimizer, each beside its modelled bytes) and the 1B
# sweep (3 timed steps each, then 1 counted). Each
# kiln-profile logs its phases' times on stderr (into its .md) as they end.
if want counters && [[ -x "$build/tests/kiln_tests" ]]; then
  echo "== [counters] tests" >"$out/counters.log"
  step 90 "$build/tests/kiln_tests" "[counters]~[per_component],[component_times]" -s >>"$out/counters.log" 2>&1 ||
    status=1
fi
if want counters && [[ -x "$build/bin/kiln-profile" ]]; then
  tiny=("$build/bin/kiln-profile" --model tiny --dtype bf16 --cutoff-len 256 --batch-size 4 --steps 2 --warmup 1
    --device cuda --counter-steps 1 --format md,json)
  step 30 "${tiny[@]}" --counters --output "$out/profile_tiny_out" >"$out/profile_tiny.md" 2>&1 || status=1
  step 30 "${tiny[@]}" --counters-per-kernel --output "$out/profile_tinyk_out" >"$out/profile_tinyk.md" 2>&1 ||
    status=1
  step 30 env KILN_CUPTI_REPLAY=user "${tiny[@]}" --counters-per-kernel --output "$out/profile_tinyu_out" \
    >"$out/profile_tinyu.md" 2>&1 || status=1
  # llama-100m without counters first: the timed steps alone, to set beside the counted run's, then
  # 3 steps under LibTorch's profiler (the per-component table's measured GPU time).
  step 60 "$build/bin/kiln-profile" --model llama-100m --dtype bf16 --cutoff-len 1024 --batch-size 8 --grad-accum 1 \
    --steps 3 --warmup 2 --device cuda --component-times --format md,json --output "$out/profile_100m_plain_out" \
    >"$out/profile_100m_plain.md" 2>&1 || status=1
  step 120 "$build/bin/kiln-profile" --model llama-100m --dtype bf16 --cutoff-len 1024 --batch-size 8 --grad-accum 1 \
    --steps 3 --warmup 2 --device cuda --counter-phases --counter-steps 1 --format md,json \
    --output "$out/profile_100m_out" >"$out/profile_100m.md" 2>&1 || status=1
  step 150 "$build/bin/kiln-profile" --config "$root/configs/profile/llama-3.2-1b.yaml" --steps 3 --warmup 1 \
    --device cuda --counters --counter-steps 1 --format md,json --output "$out/profile_1b_out" \
    >"$out/profile_1b.md" 2>&1 || status=1
  # Last, on what time is left: per-kernel counting of a tiny sweep with each kernel's component
  # (the per-component table's counted bytes), whose speed under CUPTI's serialisation is unknown.
  echo "== [per_component] test" >>"$out/counters.log"
  step 60 "$build/tests/kiln_tests" "[per_component]" -s >>"$out/counters.log" 2>&1 || status=1
  for name in tiny tinyk tinyu 100m_plain 100m 1b; do
    cp "$out/profile_${name}_out/profile.json" "$out/profile_${name}.json" 2>/dev/null
    rm -rf "$out/profile_${name}_out"
  done
fi
# 4. benchmark of the fused ops
if want bench && [[ -x "$build/bin/kiln-bench" ]]; then
  step 60 "$build/bin/kiln-bench" --json "$out/bench.json" >"$out/bench.md" 2>&1 || status=1
  # fp16 both ways: this GPU's own kernels, then the Volta code paths (KILN_KERNEL_ARCH=70).
  echo "== fp16, this GPU's kernels" >>"$out/bench.md"
  step 30 "$build/bin/kiln-bench" --dtype fp16 >>"$out/bench.md" 2>&1 || status=1
  echo "== fp16, the Volta (sm_70) code paths: KILN_KERNEL_ARCH=70" >>"$out/bench.md"
  step 30 env KILN_KERNEL_ARCH=70 "$build/bin/kiln-bench" --dtype fp16 >>"$out/bench.md" 2>&1 || status=1
fi

# 4b. kiln vs transformers on the goal's shapes (bench_vs_hf.json is rewritten after every round)
py="${KILN_DEVICE_PYTHON:-python3}"
if ! "$py" -c 'import transformers, safetensors' >/dev/null 2>&1 && [[ -d "$root/.deps/python" ]]; then
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/.deps/python"
fi
if ! want bench; then
  :
elif [[ -x "$build/bin/kiln-profile" ]] && "$py" -c 'import transformers, safetensors' >>"$log" 2>&1; then
  step 120 "$py" "$root/scripts/bench_vs_hf.py" --device cuda --rounds 2 --steps 5 --warmup 2 --budget-s 60 \
    --threads "$(nproc)" --build-dir "$build" --output "$out/bench_vs_hf_out" >"$out/bench_vs_hf.md" 2>&1 || status=1
  cp "$out/bench_vs_hf_out/bench_vs_hf.json" "$out/bench_vs_hf.json" 2>/dev/null
  [[ -s "$out/bench_vs_hf.md" ]] || cp "$out/bench_vs_hf_out/bench_vs_hf.md" "$out/bench_vs_hf.md" 2>/dev/null
  rm -rf "$out/bench_vs_hf_out"
else
  echo "device_check: bench_vs_hf skipped (no kiln-profile, or transformers not importable: see env.log)" |
    tee -a "$log" "$out/bench_vs_hf.md"
fi

# 5. attention benchmark (rows stream to the .md, the JSON is rewritten after each (T, D))
if want attention && [[ -x "$build/bin/kiln-bench" ]]; then
  step 90 "$build/bin/kiln-bench" --ops attention --iters 3 --json "$out/bench_attention.json" \
    >"$out/bench_attention.md" 2>&1 || status=1
  echo "== fp16, head dim 64, the Volta (sm_70) flash kernels: KILN_KERNEL_ARCH=70" >>"$out/bench_attention.md"
  step 40 env KILN_KERNEL_ARCH=70 "$build/bin/kiln-bench" --ops attention --dtype fp16 --head-dims 64 \
    --seqlens 1024,4096 --iters 3 >>"$out/bench_attention.md" 2>&1 || status=1
fi
# 6. NCCL: a world-size-1 data-parallel run (the NCCL path of kiln/dist) and the comm benchmark
torchrun=("${KILN_DEVICE_PYTHON:-python3}" -m torch.distributed.run --standalone --nproc-per-node 1 --no-python)
if want dist && [[ -x "$build/bin/kiln-pretrain" ]]; then
  for stage in 0 2; do
    echo "== kiln-pretrain under torchrun, NCCL, zero_stage $stage" >>"$out/dist.log"
    step 40 "${torchrun[@]}" "$build/bin/kiln-pretrain" --max_steps 40 --logging_steps 10 --eval_steps 0 \
      --save_steps 0 --bf16 true --zero_stage "$stage" --output_dir "$build/dist_run_$stage" >>"$out/dist.log" 2>&1 ||
      status=1
  done
  step 60 "${torchrun[@]}" "$build/bin/kiln-bench" --ops comm --iters 5 --json "$out/bench_comm.json" \
    >"$out/bench_comm.md" 2>&1 || status=1
fi
exit $status
