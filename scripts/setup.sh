#!/usr/bin/env bash
# Installs what kiln needs and nothing else; safe to run again (seconds on a ready machine).
#
#  - Debian packages: compiler, build tools, the C++ libraries kiln links and gloo's headers (only
#    the missing ones).
#  - LibTorch from the PyPI wheel torch==$KILN_TORCH_VERSION in a virtual environment under
#    ${KILN_HOME:-$HOME/.cache/kiln}, outside the checkout, so every clone reuses it.
#    Skipped when the caller points Torch_DIR at their own LibTorch.
#
# Prints nothing but progress; the build reads the LibTorch location from scripts/env.sh.
set -euo pipefail

KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"
KILN_TORCH_VERSION="${KILN_TORCH_VERSION:-2.11.0}"
venv="$KILN_HOME/venv"

say() { printf '[setup] %s\n' "$*"; }

# --- Debian packages -------------------------------------------------------------------------
debian_packages=(
  g++ cmake ninja-build ccache clang-format pkg-config
  libfmt-dev libspdlog-dev libcxxopts-dev catch2 libyaml-cpp-dev nlohmann-json3-dev
  libpcre2-dev libbenchmark-dev libgloo-dev zlib1g-dev
  libzstd-dev  # .jsonl.zst inputs
  chromium  # headless screenshot check of kiln-profile's HTML report (tests only)
  libcairo2-dev fonts-dejavu-core  # plot_loss figures (optional in CMake); matplotlib's font
)
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

# --- Python reference environment and LibTorch ------------------------------------------------
# The virtual environment doubles as the place for the Python *test* references (never loaded by
# the library or the apps).
# transformers/tokenizers/safetensors are the independent references of the HF-parity and
# tokenizer tests; numpy is what they (and torch's tensor conversion) need; unicodedata2 is the
# Unicode 16.0 database that scripts/gen_unicode_tables.py (and its --check test) reads.
python_packages=(
  "torch==${KILN_TORCH_VERSION}" "numpy==2.4.6" "transformers==5.24.0" "tokenizers==0.23.3"
  "safetensors==0.8.0" "pytest==9.2.0" "unicodedata2==16.0.0"
  "tensorboard==2.21.0" # reads kiln's event files (tests/python/test_run_outputs.py); brings pillow
  # pyarrow: Apache Arrow C++ with Parquet for .parquet inputs (headers and libarrow/libparquet,
  # linked as LibTorch is from torch; third_party/kiln_arrow.cmake) and the tests' Parquet writer;
  # zstandard: the tests' independent zstd writer.
  "pyarrow==26.0.1" "zstandard==0.25.0"
)

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

say "ready (KILN_HOME=$KILN_HOME)"
