#!/usr/bin/env bash
# The GPU check, as separate device calls that each finish within a budget (420 s by default), for a
# machine with an NVIDIA GPU, CUDA 13, a python3 with torch 2.11 (cu130), but none of kiln's Debian
# packages and no network. A GPU window is short (15 minutes of device time, the machine's start
# included), so each call is one command of the device tool, most valuable call first:
#
#   correctness  the [cuda] tests with CUDA_LAUNCH_BLOCKING=1, on this GPU's code paths and on the
#                Volta ones (KILN_KERNEL_ARCH=70: what a V100 runs), rope_mixed_kernel included;
#                compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every kiln
#                kernel on small shapes ([sanitize]: tests/ops/test_kernels_sanitize.cpp), both code
#                paths; then 20 bf16 steps of llama-100m whose losses must match the CPU's
#                (scripts/loss_check.py against scripts/reference/llama-100m_bf16_20steps_cpu.json).
#   speed        kiln's training step against transformers' on this GPU (scripts/bench_vs_hf.py:
#                llama-100m at 1024 x 8 and 8192 x 1, llama-3.2-1b at 2048 x 4, bf16), kiln-bench
#                (the fused ops against ATen; fp16 both ways), the attention sweep (kiln's flash
#                kernels against SDPA flash and cuDNN; then fp16 on the Volta kernels), the constants
#                kiln-profile reference takes from elsewhere until measured (the CUDA context, the
#                host's seconds per CUDA op, SDPA's backends' rates: scripts/measure_gpu_constants.py).
#   scale        NCCL data parallel under torchrun with one rank per GPU (world size 1 on one GPU):
#                kiln-pretrain, ZeRO stage 0 and 2; the comm benchmark; the [counters] and
#                [component_times] tests; kiln-profile's counted sweeps (tiny, llama-100m).
#   extra        what no longer fits scale's budget, run only when asked: tiny counted per kernel
#                under user replay, the llama-3.2-1b counted step, the [per_component] test.
#   all          every call above in turn (a long local run), each with its own budget and files.
#
# `scripts/device_check.sh --plan [CALL]` prints each call's steps, their time limits and commands,
# and the sum against the call's budget; it comes from the table below, which the calls run
# (tests/python/test_device_check.py checks that every call's sum is within its budget). Trimmed
# to fit (what the single 540 s script ran before): NCCL runs 20 steps per stage (40), the comm
# benchmark and the counted kiln-profile steps have shorter limits (45 s, 25-90 s), and the tiny
# user-replay, 1B and [per_component] steps moved to `extra`; the [counters] tests no longer run
# twice (correctness leaves them to scale). bench_vs_hf gets more (140 s, no new round after 75 s).
#
# With the device tool, after building the programs here for sm_90 (docs/kernels.md, "The GPU
# check") and packing them with `scripts/bundle_deps.sh --prebuilt build-device --no-python
# --sanitizer` (.deps: 34.7 MB, 37 MiB with the checkout's tracked files, of the 64 MiB a call
# carries; the 47 MB of programs travel xz-packed):
#   run(command="scripts/device_check.sh correctness", carry=[".deps"], timeout_s=480)
#   status()  -> budget_left_s, at once: the machine stays warm 30 s after a call
#   run(command="KILN_DEVICE_BUDGET_S=300 scripts/device_check.sh speed", carry=[".deps"], timeout_s=360)
#   give_back()
# with the speed call's budget = budget_left_s - 80 and timeout_s = budget_left_s - 20 (300 and
# 360 with 380 s left): one 15-minute window holds the machine's start, correctness (at most about
# 430 s) and speed cut to what is left (its steps run in order until the budget ends). In a later
# window, scale first:
#   run(command="scripts/device_check.sh scale", carry=[".deps"], timeout_s=480)
#
# Files: every step writes its output to device_work/CALL/STEP.log (KILN_DEVICE_WORK moves
# device_work; beside the log, what the step saves:
# JSON tables, sanitizer reports, trainer_log.jsonl); env.log holds the machine's description and
# each step's end, steps.tsv each step's limit, time and result, stalls.log what a step that ran out
# of time was doing. $OUT (the device tool's result folder, at most 8 files come back; ./device_out
# elsewhere) gets summary_CALL.txt (each step's result, then the figures) and
# device_results_CALL.tar.gz (all of device_work/CALL), rewritten after every step and when the
# script ends however it ends: a step past its limit (diagnosed into stalls.log, then SIGTERM and
# SIGKILL to its process group), a SIGTERM or SIGINT to the script (the running step is stopped,
# the summary says where), or a SIGKILL (the files of the last finished step remain). A failed or
# timed-out step does not stop the next ones; the exit status is 1 when any step failed.
#
# Each step's limit is cut to what is left of the call's budget (KILN_DEVICE_BUDGET_S, 420 s by
# default; the set-up before the first step is counted in it); a step with under 10 s left (or
# under its own limit when that is smaller) is recorded as not run. KILN_DEVICE_ONLY="racecheck
# racecheck_volta" runs only the named steps of the call.
#
# compute-sanitizer: the first of PATH, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer,
# the torch wheel's nvidia/*/bin, and .deps/compute-sanitizer.whl (bundle_deps.sh --sanitizer:
# the nvidia-cuda-sanitizer-api wheel for CUDA 13.0, unpacked into /tmp here). memcheck runs with
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 and 256 bytes of padding (each tensor its own allocation, so an
# access past its end is seen), initcheck without the caching allocator too; memcheck, racecheck
# and synccheck check kiln's kernels only (--kernel-name kns=kiln), initcheck every kernel (a write
# by an unchecked kernel would not count as initialising). --error-exitcode 99: an error found
# fails the step; the reports are STEP.sanitizer.txt.
#
# The programs: .deps/prebuilt.tar.xz unpacked into build-prebuilt/prebuilt (scripts/bundle_deps.sh
# --prebuilt BUILD_DIR, a build folder configured here with -DKILN_CUDA=ON -DKILN_BUILD_TESTS=ON
# -DKILN_PARQUET=OFF -DCMAKE_CUDA_ARCHITECTURES=90, targets kiln_tests kiln-pretrain kiln-bench
# kiln-profile kiln-hf): they load the GPU machine's own LibTorch (the same torch 2.11.0
# wheel) and the carried libraries. Where they are missing or do not start, the call builds what it
# runs first, against .deps/usr (scripts/bundle_deps.sh without --prebuilt) and torch's CMake
# package, in build-device/ (minutes of the GPU machine's 16 cores, not counted in the budget: give
# that call timeout_s=600 and expect its last steps to be cut). `scripts/device_check.sh
# --configure-only` stops after that build's configure (a check that the bundle is complete,
# runnable on any machine). KILN_DEVICE_PYTHON: the python3 with torch (python3);
# KILN_DEVICE_ARCH: CMAKE_CUDA_ARCHITECTURES of that build (90).
#
# `selftest` (not a GPU call): fake steps that exercise this script's own machinery on any machine,
# without set-up: a step past its limit, a step after it, a step that hangs until a signal
# (tests/python/test_device_check.py).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
results="${OUT:-$root/device_out}"
budget_default=420
budget="${KILN_DEVICE_BUDGET_S:-$budget_default}"
setup_s=30  # the set-up before a call's first step (env.log, the prebuilt programs' probe), budgeted
only="${KILN_DEVICE_ONLY:-}"
py="${KILN_DEVICE_PYTHON:-python3}"

# ---------------------------------------------------------------------------------------------
# The table: add CALL NAME LIMIT COMMAND declares one step. --plan prints it; a call runs its
# steps in this order, each COMMAND through eval, in its own process group, stdout and stderr into
# $out/NAME.log. Variables in COMMAND are expanded when the step runs: $tests (kiln_tests), $bin
# (the programs' folder), $out (this call's work folder), $py, $root, $build, $torchrun.
calls=(correctness speed scale extra)
step_call=() step_name=() step_limit=() step_cmd=()
add() { step_call+=("$1"); step_name+=("$2"); step_limit+=("$3"); step_cmd+=("$4"); }

# correctness. The [counters] and [component_times] tests are scale's; [sanitize] runs plainly here too.
cuda_tests='$tests --kiln-require-cuda "[cuda]~[counters]~[component_times]" -d yes'
add correctness cuda_tests 60 "CUDA_LAUNCH_BLOCKING=1 $cuda_tests"
add correctness cuda_tests_volta 45 "CUDA_LAUNCH_BLOCKING=1 KILN_KERNEL_ARCH=70 $cuda_tests"
add correctness memcheck 30 'sanitize memcheck native'
add correctness memcheck_volta 25 'sanitize memcheck volta'
add correctness racecheck 45 'sanitize racecheck native'
add correctness racecheck_volta 35 'sanitize racecheck volta'
add correctness synccheck 25 'sanitize synccheck native'
add correctness synccheck_volta 20 'sanitize synccheck volta'
add correctness initcheck 30 'sanitize initcheck native'
add correctness initcheck_volta 25 'sanitize initcheck volta'
add correctness pretrain_20 40 '$py $root/scripts/loss_check.py run --build-dir $build --device cuda --output $out/pretrain_20'

# speed: bench_vs_hf.json is rewritten after every round, the attention JSON after every (T, D).
add speed bench_vs_hf 140 '$py $root/scripts/bench_vs_hf.py --device cuda --rounds 2 --steps 5 --warmup 2 --budget-s 75 --threads $(nproc) --build-dir $build --output $out/bench_vs_hf'
add speed bench 60 '$bin/kiln-bench --predict --json $out/bench.json'
add speed bench_fp16 25 '$bin/kiln-bench --dtype fp16'
add speed bench_fp16_volta 20 'KILN_KERNEL_ARCH=70 $bin/kiln-bench --dtype fp16'
add speed attention 90 '$bin/kiln-bench --ops attention --iters 3 --json $out/attention.json'
add speed attention_volta 20 'KILN_KERNEL_ARCH=70 $bin/kiln-bench --ops attention --dtype fp16 --head-dims 64 --seqlens 1024,4096 --iters 3'
add speed attention_docs 20 '$bin/kiln-bench --ops attention --docs 8 --seqlens 8192 --iters 3 --json $out/attention_docs.json'
add speed gpu_constants 15 '$py $root/scripts/measure_gpu_constants.py --output $out/gpu_constants.json'

# scale
dist_run='"${torchrun[@]}" $bin/kiln-pretrain --max_steps 20 --logging_steps 5 --eval_steps 0 --save_steps 0 --bf16 true'
add scale nccl_zero0 30 "$dist_run --zero_stage 0 --output_dir \${TMPDIR:-/tmp}/kiln_nccl_zero0"
add scale nccl_zero2 30 "$dist_run --zero_stage 2 --output_dir \${TMPDIR:-/tmp}/kiln_nccl_zero2"
add scale comm 45 '"${torchrun[@]}" $bin/kiln-bench --ops comm --iters 5 --json $out/comm.json'
add scale counters_tests 70 '$tests "[counters]~[per_component],[component_times]" -s'
tiny='$bin/kiln-profile sweep --model tiny --dtype bf16 --cutoff-len 256 --batch-size 4 --steps 2 --warmup 1 --device cuda --counter-steps 1 --format md,json'
add scale profile_tiny 25 "$tiny --counters --output \$out/profile_tiny"
add scale profile_tinyk 25 "$tiny --counters-per-kernel --output \$out/profile_tinyk"
m100='$bin/kiln-profile sweep --model llama-100m --dtype bf16 --cutoff-len 1024 --batch-size 8 --grad-accum 1 --steps 3 --warmup 2 --device cuda --format md,json'
add scale profile_100m_plain 50 "$m100 --component-times --output \$out/profile_100m_plain"
add scale profile_100m 90 "$m100 --counter-phases --counter-steps 1 --output \$out/profile_100m"

# extra: when asked (or `all`)
add extra profile_tinyu 30 "KILN_CUPTI_REPLAY=user $tiny --counters-per-kernel --output \$out/profile_tinyu"
add extra profile_1b 150 '$bin/kiln-profile sweep --config $root/configs/profile/llama-3.2-1b.yaml --steps 3 --warmup 1 --device cuda --counters --counter-steps 1 --format md,json --output $out/profile_1b'
add extra per_component 60 '$tests "[per_component]" -s'

# selftest: this script's machinery alone (no set-up, no GPU): a step past its limit, the step
# after it, a step that hangs until a signal stops the script, and one after that.
add selftest first 5 'echo "first step ran" >$out/first.txt'
add selftest overrun 2 'echo "overrun started"; sleep 30; echo "overrun not stopped" >$out/overrun_survived.txt'
add selftest after 5 'echo "after ran" >$out/after.txt'
add selftest hang 30 'echo "hang started" >$out/hang_started.txt; sleep 60; echo "hang not stopped" >$out/hang_survived.txt'
add selftest last 5 'echo "last ran" >$out/last.txt'

# The indices of CALL's steps, in order.
steps_of() {
  local i
  for i in "${!step_call[@]}"; do [[ "${step_call[$i]}" == "$1" ]] && echo "$i"; done
}
call_setup_s() { [[ "$1" == selftest ]] && echo 0 || echo "$setup_s"; }

# --plan [CALL]: each call's steps, limits and commands; "call" lines hold the sums. Exit status 1
# when a call's limits and set-up exceed its budget.
plan() {
  local c i sum n over=0 setup
  for c in "$@"; do
    sum=0 n=0
    for i in $(steps_of "$c"); do sum=$((sum + step_limit[i])) n=$((n + 1)); done
    setup="$(call_setup_s "$c")"
    echo "call $c: budget $budget s = set-up $setup s + $n steps $sum s ($((budget - setup - sum)) s spare)"
    for i in $(steps_of "$c"); do
      printf '  %-20s %4d s  %s\n' "${step_name[i]}" "${step_limit[i]}" "${step_cmd[i]}"
    done
    ((setup + sum > budget)) && over=1
  done
  return $over
}

usage() {
  echo "usage: scripts/device_check.sh correctness|speed|scale|extra|all|selftest" >&2
  echo "       scripts/device_check.sh --plan [CALL]    scripts/device_check.sh --configure-only" >&2
  exit 2
}

case "${1:-}" in
  --plan)
    if [[ -n "${2:-}" ]]; then
      [[ -n "$(steps_of "$2")" ]] || usage
      plan "$2"
    else
      plan "${calls[@]}"
    fi
    exit $?
    ;;
  all)
    rc=0
    for c in correctness speed scale extra; do "$0" "$c" || rc=1; done
    exit $rc
    ;;
  --configure-only) call=configure ;;
  "") usage ;;
  *)
    [[ -n "$(steps_of "$1")" ]] || usage
    call="$1"
    ;;
esac

# ---------------------------------------------------------------------------------------------
out="${KILN_DEVICE_WORK:-$root/device_work}/$call"
rm -rf "$out"
mkdir -p "$out" "$results"
log="$out/env.log"
: >"$out/steps.tsv"
current="" current_pgid="" status=0 uncounted=0 where="the set-up"

# The summary: each step of the call with its limit, time taken and result, then what the logs hold.
summary() {
  local i name rest
  echo "== device_check $call: budget ${budget}s"
  printf '%-20s %6s %6s  %s\n' step limit took result
  for i in $(steps_of "$call"); do
    name="${step_name[i]}"
    rest="$(awk -F'\t' -v n="$name" '$1 == n {printf "%6s %6s  %s", $2 "s", $3 "s", $4}' "$out/steps.tsv")"
    printf '%-20s %s\n' "$name" "${rest:-$(printf '%6s %6s  %s' "${step_limit[i]}s" - "not run")}"
  done
  grep -hE "^(device_check: (stopped|using|the prebuilt|build|configure|compute-sanitizer)|no CUDA device)" "$log" \
    2>/dev/null | sort -u
  # correctness
  for name in cuda_tests cuda_tests_volta; do
    [[ -f "$out/$name.log" ]] || continue
    echo "== $name"
    grep -E "^(All tests passed|test cases:|assertions:|FAILED|.*: FAILED:)" "$out/$name.log"
  done
  for name in memcheck memcheck_volta racecheck racecheck_volta synccheck synccheck_volta initcheck initcheck_volta; do
    [[ -f "$out/$name.sanitizer.txt" ]] || continue
    echo "== $name: $(grep -hE "(ERROR|RACECHECK) SUMMARY" "$out/$name.sanitizer.txt" | tr '\n' ' ')"
    grep -hE "^(All tests passed|test cases:|FAILED)" "$out/$name.log" 2>/dev/null
    # The kinds of error, then where (the kernels named: initcheck checks ATen's and cuBLAS's too).
    grep -hE "^========= (Invalid|Uninitialized|Error|Barrier|Race|Warning|Program hit)" "$out/$name.sanitizer.txt" |
      sort | uniq -c | sort -rn | head -n 5
    grep -hE "^=========  +at " "$out/$name.sanitizer.txt" | sed 's/+0x[0-9a-f]*//' | cut -c1-200 |
      sort | uniq -c | sort -rn | head -n 5
  done
  [[ -f "$out/pretrain_20.log" ]] && { echo "== pretrain_20"; grep -E "^ *[0-9]+  |^trend:|^loss_check" "$out/pretrain_20.log"; }
  # speed
  [[ -f "$out/bench_vs_hf.log" ]] && grep -E "^(\||# kiln vs|bench_vs_hf:)" "$out/bench_vs_hf.log"
  for name in bench bench_fp16 bench_fp16_volta; do
    [[ -f "$out/$name.log" ]] && { echo "== $name"; grep -E "^(\||#|[a-z_ ]+:)" "$out/$name.log"; }
  done
  for name in attention attention_volta attention_docs; do
    [[ -f "$out/$name.log" ]] || continue
    echo "== $name"
    if grep -q "^## kiln" "$out/$name.log"; then
      grep -h "^WARNING: T=" "$out/$name.log"
      sed -n '/^## kiln/,$p' "$out/$name.log"
    else
      tail -n 12 "$out/$name.log"
    fi
  done
  # scale
  for name in nccl_zero0 nccl_zero2; do
    [[ -f "$out/$name.log" ]] && { echo "== $name"; grep -E "^(  Distributed|kiln-pretrain:|\{'(loss|eval_loss|train_runtime)')" "$out/$name.log"; }
  done
  [[ -f "$out/comm.log" ]] && { echo "== comm"; tail -n 9 "$out/comm.log"; }
  [[ -f "$out/counters_tests.log" ]] && grep -hE "(copy|matmul): |small kernels in |phase one |^(All tests passed|test cases:|FAILED)" "$out/counters_tests.log" | sort -u
  [[ -f "$out/per_component.log" ]] && grep -hE "per component: | MB counted, |^(All tests passed|test cases:|FAILED)" "$out/per_component.log" | sort -u
  for name in profile_tiny profile_tinyk profile_tinyu profile_100m_plain profile_100m profile_1b; do
    [[ -f "$out/$name.log" ]] && { echo "== $name"; grep -hE "^(\||counters:|# |peak:|roofline|kiln-profile: cutoff_len)" "$out/$name.log"; }
  done
  grep -hE "^== |^stall:" "$out/stalls.log" 2>/dev/null | head -n 60
  echo "device_check: $call ${1:-running} after ${SECONDS}s"
}
# summary_CALL.txt and device_results_CALL.tar.gz, each written to a temporary name and renamed,
# so a kill mid-write leaves the previous pair.
save() {
  summary "$@" >"$results/.summary_$call.txt.tmp" 2>&1
  mv -f "$results/.summary_$call.txt.tmp" "$results/summary_$call.txt"
  tar -C "$out" -czf "$results/.device_results_$call.tar.gz.tmp" . 2>/dev/null
  mv -f "$results/.device_results_$call.tar.gz.tmp" "$results/device_results_$call.tar.gz"
}
finish() {
  local rc=$?
  trap - EXIT TERM INT
  ((rc == 0 && status != 0)) && rc=$status
  save "ended, exit status $rc"
  cat "$results/summary_$call.txt"
  exit "$rc"
}
# Stops the process group $1: SIGTERM, then SIGKILL after up to 5 s.
stop_group() {
  local pgid=$1 waited=0
  kill -TERM -- "-$pgid" 2>/dev/null || return 0
  while kill -0 -- "-$pgid" 2>/dev/null && ((waited < 10)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  kill -KILL -- "-$pgid" 2>/dev/null
  return 0
}
on_signal() {
  echo "device_check: stopped by SIG$1 after ${SECONDS}s, during $where" | tee -a "$log" >&2
  if [[ -n "$current_pgid" ]]; then
    stop_group "$current_pgid"
    printf '%s\t%s\t%s\t%s\n' "$current" "$current_limit" "$((SECONDS - current_start))" "stopped by SIG$1" \
      >>"$out/steps.tsv"
  fi
  status=1
  if [[ "$1" == TERM ]]; then exit 143; else exit 130; fi
}
trap finish EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# What a step that ran out of time is doing (stalls.log): per process of its group and thread,
# state, user and system CPU ticks and wait channel, twice 2 s apart (growing ticks: busy; the same:
# blocked, the wait channel says on what); the GPU's utilisation; gdb's backtraces where gdb exists.
diagnose() {
  local pgid=$1 p t round pids
  shift
  pids="$(pgrep -g "$pgid" 2>/dev/null || echo "$pgid")"
  {
    echo "== stall after ${SECONDS}s: $*"
    for round in 1 2; do
      for p in $pids; do
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
    nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,power.draw --format=csv 2>&1 |
      sed 's/^/stall: /'
    if command -v gdb >/dev/null; then
      for p in $pids; do
        timeout 15 gdb -p "$p" -batch -ex "thread apply all bt 12" 2>&1 | grep -E "^(Thread|#)" | head -n 100
      done
    else
      echo "stall: no gdb here for backtraces"
    fi
  } >>"$out/stalls.log" 2>&1
}

# Runs step $1 (an index of the table) within its limit, cut to what is left of the budget.
run_step() {
  local i=$1 name="${step_name[$1]}" limit="${step_limit[$1]}" secs left rc result waited=0 pid
  left=$((budget + uncounted - SECONDS))
  ((left < 0)) && left=0
  secs=$((left < limit ? left : limit))
  if [[ -n "$only" && " $only " != *" $name "* ]]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" 0 "skipped (KILN_DEVICE_ONLY)" >>"$out/steps.tsv"
    return 0
  fi
  if ((secs < (limit < 10 ? limit : 10))); then
    echo "device_check: no time left for $name (${left}s of the budget)" | tee -a "$log"
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" 0 "not run: no time left" >>"$out/steps.tsv"
    return 0
  fi
  current="$name" current_limit="$secs" current_start=$SECONDS where="step $name"
  # Job control for the fork alone: the step gets its own process group (the whole tree is stopped
  # at once), and the shell prints no job notices.
  set -m
  (eval "${step_cmd[$i]}") >>"$out/$name.log" 2>&1 </dev/null &
  pid=$!
  set +m
  echo "device_check: $name (limit ${secs}s, process group $pid) at ${SECONDS}s: ${step_cmd[$i]}" >>"$log"
  current_pgid=$pid
  while kill -0 "$pid" 2>/dev/null && ((waited < 2 * secs)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    diagnose "$pid" "$name"
    stop_group "$pid"
    wait "$pid" 2>/dev/null
    rc=124
    result="timed out after ${secs}s (stalls.log)"
  else
    wait "$pid"
    rc=$?
    case $rc in
      0) result="ok" ;;
      77) result="skipped: no CUDA device (exit status 77)" ;;
      99) result="FAILED: compute-sanitizer found errors (exit status 99)" ;;
      127) result="FAILED: a program is missing (exit status 127)" ;;
      *) result="FAILED: exit status $rc" ;;
    esac
  fi
  current="" current_pgid="" where="the files of step $name"
  ((rc != 0)) && status=1
  echo "device_check: $name: $result" | tee -a "$log" >&2
  printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$((SECONDS - current_start))" "$result" >>"$out/steps.tsv"
  save
}

# compute-sanitizer, found on this machine or unpacked from the carried wheel.
find_sanitizer() {
  local c site
  site="$(dirname "${torch_dir:-/nonexistent}")"
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer "$site"/nvidia/*/bin/compute-sanitizer; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return 0; }
  done
  if [[ -f "$root/.deps/compute-sanitizer.whl" ]]; then
    local dest="${TMPDIR:-/tmp}/kiln_compute_sanitizer"
    rm -rf "$dest"
    "$py" -m zipfile -e "$root/.deps/compute-sanitizer.whl" "$dest" >/dev/null 2>&1
    for c in "$dest"/nvidia/*/bin/compute-sanitizer; do
      [[ -f "$c" ]] && chmod +x "$c" && { echo "$c"; return 0; }
    done
  fi
  return 1
}
# sanitize TOOL native|volta: the [sanitize] test case under compute-sanitizer's TOOL.
sanitize() {
  local tool=$1 path=$2 args=()
  if [[ -z "$sanitizer" ]]; then
    echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer, the torch" \
      "wheel's nvidia/*/bin, .deps/compute-sanitizer.whl from scripts/bundle_deps.sh --sanitizer)"
    return 127
  fi
  args=(--tool "$tool" --error-exitcode 99 --print-limit 50 --log-file "$out/$current.sanitizer.txt")
  [[ "$tool" != initcheck ]] && args+=(--kernel-name kns=kiln)
  [[ "$tool" == memcheck ]] && args+=(--padding 256)
  [[ "$path" == volta ]] && export KILN_KERNEL_ARCH=70
  [[ "$tool" == memcheck || "$tool" == initcheck ]] && export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  echo "$path code paths (KILN_KERNEL_ARCH=${KILN_KERNEL_ARCH:-unset}): $sanitizer ${args[*]} $tests --kiln-require-cuda [sanitize]"
  "$sanitizer" "${args[@]}" "$tests" --kiln-require-cuda "[sanitize]"
}

# ---------------------------------------------------------------------------------------------
# Set-up (real calls): the machine's description, the carried libraries, the programs.
if [[ "$call" == selftest ]]; then
  build="$out" bin="$out" tests=false sanitizer="" torchrun=(false) where="between steps"
  for i in $(steps_of "$call"); do run_step "$i"; done
  exit $status
fi

deps="$root/.deps/usr"
build="$root/build-device"
{
  date
  nvidia-smi || true
  nvcc --version || true
  cmake --version | head -1
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} >>"$log" 2>&1
read -r torch_dir ngpu < <("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__), max(1, torch.cuda.device_count()))' 2>>"$log")
if [[ -z "$torch_dir" ]]; then
  echo "device_check: $py cannot import torch (env.log)" | tee -a "$log"
  exit 1
fi
Torch_DIR="$torch_dir/share/cmake/Torch"
multi="$deps/lib/x86_64-linux-gnu"
if [[ -d "$deps" ]]; then
  # The carried pkg-config files name /usr as prefix; point them at the bundle.
  find "$deps" -name '*.pc' -exec sed -i "s|^prefix=.*|prefix=$deps|" {} +
  export PATH="$deps/bin:$PATH"
  export LD_LIBRARY_PATH="$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$multi/pkgconfig:$deps/share/pkgconfig"
fi
# transformers for bench_vs_hf.py: the machine's own, else the carried one (bundle_deps.sh without --no-python).
if ! "$py" -c 'import transformers, safetensors' >/dev/null 2>&1 && [[ -d "$root/.deps/python" ]]; then
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/.deps/python"
fi

# Programs built elsewhere: this machine's LibTorch (and the wheel's CUDA libraries, CUPTI among
# them) and the carried libraries on the search path, and the checkout they were built from (its
# test fixtures) linked to this one. They are used when they start; else the build below runs.
prebuilt="$root/.deps/prebuilt"
use_prebuilt=0
if [[ -f "$root/.deps/prebuilt.tar.xz" && ! -x "$prebuilt/tests/kiln_tests" && "$call" != configure ]]; then
  # bundle_deps.sh --prebuilt packs the programs (47 MB to about 10 MB of the carry); unpacked
  # into build-prebuilt/, which is ignored and never carried.
  rm -rf "$root/build-prebuilt"
  mkdir -p "$root/build-prebuilt"
  (tar -C "$root/build-prebuilt" -xJf "$root/.deps/prebuilt.tar.xz" ||
    "$py" -c 'import sys, tarfile as t; t.open(sys.argv[1]).extractall(sys.argv[2], **({"filter": "data"} if hasattr(t, "data_filter") else {}))' "$root/.deps/prebuilt.tar.xz" \
      "$root/build-prebuilt") >>"$log" 2>&1 || echo "device_check: could not unpack .deps/prebuilt.tar.xz (env.log)" | tee -a "$log"
  prebuilt="$root/build-prebuilt/prebuilt"
fi
if [[ -x "$prebuilt/tests/kiln_tests" && "$call" != configure ]]; then
  export LD_LIBRARY_PATH="$prebuilt/lib:$torch_dir/lib:$(dirname "$torch_dir")/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  src="$(cat "$prebuilt/source_root")"
  if [[ "$src" != "$root" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
  fi
  {
    echo "== prebuilt programs (.deps/prebuilt, built at $src)"
    ldd "$prebuilt/tests/kiln_tests" | grep -E "not found|torch|cupti|cudart|kiln" || true
  } >>"$log" 2>&1
  # (Catch2's --list-tests exits with the number of tests it lists.)
  "$prebuilt/tests/kiln_tests" --list-tests "[cuda]" >"$out/cuda_tests_list.txt" 2>&1
  cat "$out/cuda_tests_list.txt" >>"$log"
  if grep -q "matching test case" "$out/cuda_tests_list.txt" && "$prebuilt/bin/kiln-profile" --help >/dev/null 2>>"$log"; then
    use_prebuilt=1
    build="$prebuilt"
    echo "device_check: using the prebuilt programs" | tee -a "$log"
  else
    echo "device_check: the prebuilt programs do not start here (env.log): building" | tee -a "$log"
  fi
fi

# The build, when no prebuilt programs start (explicit package folders: the machine's CMake may
# not search multiarch paths). Its time is added to the budget.
if ((!use_prebuilt)); then
  if [[ ! -d "$deps" ]]; then
    echo "device_check: no prebuilt programs and $deps missing: run scripts/bundle_deps.sh here and carry .deps" |
      tee -a "$log"
    exit 2
  fi
  build_start=$SECONDS
  (cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$Torch_DIR" \
    -DCMAKE_PREFIX_PATH="$deps" -DKILN_FETCH_MISSING=OFF -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${KILN_DEVICE_ARCH:-90}" \
    -DKILN_PTXAS_VERBOSE=ON -DKILN_PYTHON= -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkgconf" \
    -Dfmt_DIR="$multi/cmake/fmt" -Dspdlog_DIR="$multi/cmake/spdlog" -Dyaml-cpp_DIR="$multi/cmake/yaml-cpp" \
    -Dbenchmark_DIR="$multi/cmake/benchmark" \
    -DCatch2_DIR="$deps/lib/cmake/Catch2" -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json") >>"$log" 2>&1 ||
    { echo "device_check: configure failed (env.log)" | tee -a "$log"; exit 1; }
  if [[ "$call" == configure ]]; then
    echo "device_check: configured $build"
    trap - EXIT
    exit 0
  fi
  case "$call" in
    correctness) targets=(--target kiln_tests --target kiln-pretrain) ;;
    speed) targets=(--target kiln-bench --target kiln-profile --target kiln-hf) ;;
    *) targets=(--target kiln_tests --target kiln-pretrain --target kiln-bench --target kiln-profile) ;;
  esac
  timeout 480 cmake --build "$build" -j "$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1 ||
    { echo "device_check: build failed (build.log)" | tee -a "$log"; status=1; }
  grep -E "Compiling entry|registers|spill" "$out/build.log" >"$out/ptxas.txt" || true
  uncounted=$((SECONDS - build_start))
  echo "device_check: build took $((SECONDS - build_start))s (not counted in the budget)" | tee -a "$log"
fi
bin="$build/bin"
tests="$build/tests/kiln_tests"
torchrun=("$py" -m torch.distributed.run --standalone --nproc-per-node "$ngpu" --no-python)
sanitizer=""
if [[ "$call" == correctness ]]; then
  sanitizer="$(find_sanitizer)" && echo "device_check: compute-sanitizer: $sanitizer ($("$sanitizer" --version | tail -n 1))" |
    tee -a "$log"
fi
echo "device_check: set-up took $((SECONDS - uncounted))s" >>"$log"
where="between steps"
save

for i in $(steps_of "$call"); do run_step "$i"; done
exit $status
