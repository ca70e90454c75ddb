#!/usr/bin/env bash
# Installs what kiln needs and nothing else; safe to run again (seconds on a ready machine).
#
#   scripts/setup.sh           what building and running kiln needs (scripts/quickstart.sh)
#   scripts/setup.sh --tests   that, and what only the test suite needs (scripts/test.sh)
#
#  - Debian packages: compiler, build tools, the C++ libraries kiln links and gloo's headers (only
#    the missing ones); with --tests also Catch2, clang-format, clang with libFuzzer, Chromium and Slurm.
#  - LibTorch from a PyPI wheel in a virtual environment under ${KILN_HOME:-$HOME/.cache/kiln},
#    outside the checkout, so every clone reuses it: torch==2.11.0 (CUDA 13) in venv/, or, for a
#    V100 or a driver older than CUDA 13, torch==2.10.0 (CUDA 12) in venv-cu12/ with a CUDA 12
#    nvcc (scripts/choose_torch.sh, scripts/fetch_cuda12.sh). KILN_CUDA=12|13 forces the choice.
#    Skipped when the caller points Torch_DIR at their own LibTorch. With --tests, the Python test
#    references go into the same environment (transformers, tokenizers, pytest, ...).
#
# Prints nothing but progress; the build reads the LibTorch location from scripts/env.sh.
set -euo pipefail
tests=0
case "${1:-}" in
  --tests) tests=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"
root="$(cd "$(dirname "$0")/.." && pwd)"

say() { printf '[setup] %s\n' "$*"; }

# --- Debian packages -------------------------------------------------------------------------
debian_packages=(
  g++ cmake ninja-build ccache pkg-config
  libfmt-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev
  libpcre2-dev libbenchmark-dev libgloo-dev zlib1g-dev
  libzstd-dev  # .jsonl.zst inputs
  libcairo2-dev fonts-dejavu-core  # plot_loss figures (optional in CMake); matplotlib's font
)
if ((tests)); then
  debian_packages+=(
    catch2 clang-format
    clang-14 libclang-rt-14-dev  # libFuzzer and the sanitizers' runtimes (scripts/fuzz.sh)
    chromium  # headless screenshot check of kiln-profile's HTML report
    slurmctld slurmd slurm-client munge  # a one-host Slurm cluster (tests/python/test_slurm.py)
  )
fi
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Which LibTorch: the CUDA 13 build (torch 2.11.0) or, for a V100 or a driver older than
# CUDA 13, the CUDA 12 build (torch 2.10.0) with a CUDA 12 nvcc (scripts/choose_torch.sh says how
# it chooses; KILN_CUDA=12|13 forces it). The choice is recorded for scripts/env.sh.
choice="$("$root/scripts/choose_torch.sh")"
eval "$choice"
if [[ "$KILN_FETCH_CUDA12" == 1 ]]; then
  say "no CUDA 12 nvcc on this machine: fetching one into $KILN_HOME/cuda-12"
  "$root/scripts/fetch_cuda12.sh" >/dev/null
fi
venv="$KILN_VENV"
mkdir -p "$KILN_HOME"
{
  echo "# Written by scripts/setup.sh: the LibTorch and nvcc of this machine ($KILN_CHOICE_WHY)."
  echo "KILN_CUDA_MAJOR=$KILN_CUDA_MAJOR"
  echo "KILN_VENV=$venv"
  echo "KILN_SELECTED_CUDACXX=$CUDACXX"
} >"$KILN_HOME/selected.env.tmp"
# selected-cu<major>.env for builds that name their major (KILN_CUDA=12 scripts/test.sh), and
# selected.env for the ones that do not: the machine's own choice, or the last one forced.
cp "$KILN_HOME/selected.env.tmp" "$KILN_HOME/selected-cu$KILN_CUDA_MAJOR.env"
mv "$KILN_HOME/selected.env.tmp" "$KILN_HOME/selected.env"

# --- Python reference environment and LibTorch ------------------------------------------------
# Run time: torch (LibTorch) and pyarrow (Apache Arrow C++ with Parquet for .parquet inputs:
# headers and libarrow/libparquet, linked as LibTorch is from torch; third_party/kiln_arrow.cmake).
python_packages=("torch==${KILN_TORCH_VERSION}" "pyarrow==26.0.1")
# Tests only: the environment doubles as the place of the Python *test* references (never loaded
# by the library or the apps). transformers/tokenizers/safetensors are the independent references
# of the HF-parity and tokenizer tests; numpy is what they (and torch's tensor conversion) need;
# unicodedata2 is the Unicode 16.0 database that scripts/gen_unicode_tables.py (and its --check
# test) reads; tensorboard reads kiln's event files (tests/python/test_run_outputs.py); zstandard
# is the tests' independent zstd writer (pyarrow their Parquet writer); accelerate is what
# transformers' Trainer needs to run (tests/python/test_hf_trainer_resume.py).
if ((tests)); then
  python_packages+=(
    "numpy==2.4.6" "transformers==5.24.0" "tokenizers==0.23.3" "safetensors==0.8.0" "pytest==9.2.0"
    "unicodedata2==16.0.0" "tensorboard==2.21.0" "zstandard==0.25.0" "accelerate==1.15.0"
  )
fi

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating virtual environment $venv"
  mkdir -p "$KILN_HOME"
  python3 -m venv "$venv"
fi

have_dist() { # name version -> true when that exact distribution is installed in the venv
  compgen -G "$venv/lib/python3*/site-packages/$1-$2.dist-info" >/dev/null
}
to_install=()
for spec in "${python_packages[@]}"; do
  name="${spec%%==*}"
  version="${spec#*==}"
  if [[ "$name" == torch && -n "${Torch_DIR:-}" ]]; then
    [[ -f "$Torch_DIR/TorchConfig.cmake" ]] || {
      echo "[setup] error: Torch_DIR=$Torch_DIR has no TorchConfig.cmake" >&2
      exit 1
    }
    continue
  fi
  have_dist "$name" "$version" || to_install+=("$spec")
done
if ((${#to_install[@]})); then
  say "installing into $venv: ${to_install[*]} (LibTorch with CUDA is a few GB, once)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${to_install[@]}"
fi

what="ready"
((tests)) && what="ready for the tests"
say "$what (KILN_HOME=$KILN_HOME; ${Torch_DIR:+your LibTorch at $Torch_DIR, }torch==$KILN_TORCH_VERSION, CUDA $KILN_CUDA_MAJOR build, nvcc $CUDACXX: $KILN_CHOICE_WHY)"
