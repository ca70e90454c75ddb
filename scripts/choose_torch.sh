#!/usr/bin/env bash
# Chooses the LibTorch build for this machine (scripts/setup.sh runs it; README.md, "V100 and CUDA 12").
# Prints KEY=VALUE lines: KILN_CUDA_MAJOR (12 or 13), KILN_TORCH_VERSION, KILN_VENV, CUDACXX (the
# nvcc to build with; empty when it must be fetched: KILN_FETCH_CUDA12=1), and KILN_CHOICE_WHY.
#
#   KILN_CUDA=12|13 forces the choice. Otherwise, from nvidia-smi:
#     no GPU (no nvidia-smi)                     -> 13: torch 2.11.0 (cu130), as on CPU machines
#     a GPU below compute capability 7.5 (V100)  -> 12: torch 2.10.0 (cu128); CUDA 13 has no sm_70
#     a driver older than CUDA 13.0 (R580)       -> 12: cu130 needs an R580 driver; cu128 runs on R525+
#     else                                       -> 13
#   The nvcc: CUDACXX, then /usr/local/cuda-<major>.* (newest), /usr/local/cuda, nvcc on PATH, and
#   for 12 the toolkit scripts/fetch_cuda12.sh keeps in $KILN_HOME/cuda-12. Its CUDA major must be
#   LibTorch's: otherwise one line names both and what to install, and the exit status is 1.
# A user's own LibTorch (Torch_DIR) is kept; its CUDA major is read from its build-version file or
# the libcudart its libtorch_cuda.so needs, and checked against the nvcc the same way.
set -euo pipefail
KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"

nvcc_major() {  # nvcc path -> its CUDA major, or nothing
  "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1
}

# The CUDA major this machine's GPUs and driver want, and why.
major=""
why=""
if [[ -n "${KILN_CUDA:-}" ]]; then
  [[ "$KILN_CUDA" == 12 || "$KILN_CUDA" == 13 ]] || {
    echo "choose_torch: KILN_CUDA=$KILN_CUDA: expected 12 or 13" >&2
    exit 1
  }
  major="$KILN_CUDA"
  why="KILN_CUDA=$KILN_CUDA"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  major=13
  why="no GPU: the CUDA 13 build"
else
  driver_cuda="$( (nvidia-smi 2>/dev/null || true) | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' | head -1)"
  lowest=""
  lowest_name=""
  while IFS=, read -r name cap; do
    name="$(echo "$name" | sed 's/^ *//; s/ *$//')"
    cap="$(echo "$cap" | tr -d ' ')"
    if ! [[ "$cap" =~ ^[0-9]+\.[0-9]+$ ]]; then  # a driver without the compute_cap field (before R510)
      case "$name" in
        *V100*) cap=7.0 ;; *P100*) cap=6.0 ;; *T4*|*RTX\ 20*|*Quadro\ RTX*) cap=7.5 ;; *) cap=8.0 ;;
      esac
    fi
    [[ -n "$name" ]] || continue
    cc=$(( ${cap%.*} * 10 + ${cap#*.} ))
    if [[ -z "$lowest" || $cc -lt $lowest ]]; then
      lowest=$cc
      lowest_name="$name"
    fi
  done < <(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null || nvidia-smi --query-gpu=name --format=csv,noheader)
  driver_major="${driver_cuda%%.*}"
  if [[ -n "$lowest" && $lowest -lt 75 ]]; then
    major=12
    why="$lowest_name (compute capability $((lowest / 10)).$((lowest % 10))): CUDA 13 no longer targets it"
  elif [[ -n "$driver_major" && $driver_major -lt 13 ]]; then
    major=12
    why="the driver supports CUDA $driver_cuda: the CUDA 13 build needs CUDA 13.0 (an R580 driver)"
  else
    major=13
    why="${lowest_name:-GPU} and a driver for CUDA ${driver_cuda:-13}"
  fi
fi

# A user's own LibTorch: its CUDA major, when it says.
torch_major="$major"
if [[ -n "${Torch_DIR:-}" ]]; then
  prefix="$(cd "$Torch_DIR/../../.." 2>/dev/null && pwd || true)"
  torch_major=""
  if [[ -f "$prefix/build-version" ]]; then
    torch_major="$(sed -n 's/.*+cu\([0-9][0-9]\)[0-9]*.*/\1/p' "$prefix/build-version")"
  fi
  if [[ -z "$torch_major" && -f "$prefix/lib/libtorch_cuda.so" ]]; then
    torch_major="$(readelf -d "$prefix/lib/libtorch_cuda.so" 2>/dev/null | sed -n 's/.*libcudart\.so\.\([0-9]*\).*/\1/p' | head -1)"
  fi
  if [[ -z "$torch_major" ]]; then
    torch_major="$major"  # a CPU LibTorch, or one that does not say: nothing to match
    why="$why; Torch_DIR's LibTorch (CUDA version not recorded)"
  else
    why="$why; Torch_DIR's LibTorch is a CUDA $torch_major build"
  fi
  major="$torch_major"
fi

# The nvcc of that major.
candidates=()
[[ -n "${CUDACXX:-}" ]] && candidates+=("$CUDACXX")
while IFS= read -r d; do candidates+=("$d/bin/nvcc"); done < <(ls -d /usr/local/cuda-"$major".* 2>/dev/null | sort -rV)
candidates+=(/usr/local/cuda/bin/nvcc)
command -v nvcc >/dev/null 2>&1 && candidates+=("$(command -v nvcc)")
[[ "$major" == 12 ]] && candidates+=("$KILN_HOME/cuda-12/bin/nvcc")
nvcc=""
found=""
for c in "${candidates[@]}"; do
  [[ -x "$c" ]] || continue
  m="$(nvcc_major "$c")"
  [[ -n "$m" ]] || continue
  [[ -z "$found" ]] && found="$c (CUDA $m)"
  if [[ "$m" == "$major" ]]; then
    nvcc="$c"
    break
  fi
done
fetch=0
if [[ -z "$nvcc" ]]; then
  if [[ "$major" == 12 ]]; then
    fetch=1  # setup.sh fetches Debian's CUDA 12.4 toolkit into the cache (scripts/fetch_cuda12.sh)
    nvcc="$KILN_HOME/cuda-12/bin/nvcc"
  else
    echo "choose_torch: LibTorch is a CUDA $major build but the nvcc found is ${found:-none}: install the CUDA $major toolkit (or set CUDACXX to its nvcc), or set KILN_CUDA=12" >&2
    exit 1
  fi
elif [[ -n "${CUDACXX:-}" && "$nvcc" != "$CUDACXX" ]]; then
  echo "choose_torch: LibTorch is a CUDA $major build but CUDACXX=$CUDACXX is CUDA $(nvcc_major "$CUDACXX"): set CUDACXX to a CUDA $major nvcc, or KILN_CUDA=$(nvcc_major "$CUDACXX")" >&2
  exit 1
fi

if [[ "$major" == 12 ]]; then
  version=2.10.0
  venv="$KILN_HOME/venv-cu12"
else
  version=2.11.0
  venv="$KILN_HOME/venv"
fi
echo "KILN_CUDA_MAJOR=$major"
echo "KILN_TORCH_VERSION=${KILN_TORCH_VERSION:-$version}"
echo "KILN_VENV=$venv"
echo "CUDACXX=$nvcc"
echo "KILN_FETCH_CUDA12=$fetch"
echo "KILN_CHOICE_WHY=\"$why\""
