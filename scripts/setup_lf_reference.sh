#!/usr/bin/env bash
# Makes the Python environment of the LLaMA-Factory 0.9.5 reference that kiln's tests compare
# against (tests/python/llamafactory_reference.py); safe to run again (about a second when ready).
#
#   scripts/setup_lf_reference.sh          create or repair ${KILN_HOME:-$HOME/.cache/kiln}/venv-lf
#   scripts/setup_lf_reference.sh --print  only print the venv's python (no changes)
#
# Test-only: nothing in the library or the apps uses it.
#
#  - venv-lf lives outside the checkout, next to the main venv, and is made with the main venv's
#    interpreter (same Python minor).
#  - torch is NOT downloaded again: venv-lf/borrowed-torch/ holds symlinks to the main venv's torch
#    stack (torch, torchgen, functorch, triton, nvidia-*, cuda-*, with their .dist-info so pip sees
#    them as installed) and a .pth file puts that folder on venv-lf's sys.path *after* venv-lf's own
#    site-packages. Run scripts/setup.sh first (it installs that torch).
#  - llamafactory==0.9.5 is installed with --no-deps, then exactly the pinned closure below (also
#    --no-deps, so nothing floats): the newest versions its metadata admits of the packages its data
#    pipeline and trainer import (transformers<=5.6.0, datasets<=4.0.0, accelerate<=1.11.0,
#    peft<=0.18.1, trl<=0.24.0), torchaudio (llamafactory.data.mm_plugin imports it) matching the
#    borrowed torch, and their dependencies as pip resolved them. LLaMA-Factory's web UI, API,
#    multimodal and hub extras (gradio, fastapi, av, modelscope, torchvision, ...) are left out on
#    purpose, so `pip check` lists them as missing: the reference never imports them.
set -euo pipefail
print_only=0
case "${1:-}" in
  --print) print_only=1 ;;
  "") ;;
  *) echo "usage: scripts/setup_lf_reference.sh [--print]" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
# KILN_HOME and KILN_VENV (the main venv with torch), as the build scripts see them.
# shellcheck source=/dev/null
source "$root/scripts/env.sh"
venv="$KILN_HOME/venv-lf"
if ((print_only)); then
  echo "$venv/bin/python"
  exit 0
fi

say() { printf '[setup-lf] %s\n' "$*"; }
die() { printf '[setup-lf] error: %s\n' "$*" >&2; exit 1; }

# --- the main venv's torch ------------------------------------------------------------------------
main_sp=""
for d in "$KILN_VENV"/lib/python3*/site-packages; do [[ -d "$d/torch" ]] && main_sp="$d"; done
[[ -n "$main_sp" ]] || die "no torch in $KILN_VENV: run scripts/setup.sh first"
torch_dist="$(compgen -G "$main_sp/torch-*.dist-info" | head -n1 || true)"
[[ -n "$torch_dist" ]] || die "no torch-*.dist-info in $main_sp"
torch_version="${torch_dist##*/torch-}"
torch_version="${torch_version%.dist-info}"
case "$torch_version" in
  2.11.0) torchaudio_version=2.11.0 ;;  # venv/ (CUDA 13 build)
  2.10.0) torchaudio_version=2.10.0 ;;  # venv-cu12/ (CUDA 12 build)
  *) die "torch $torch_version in $KILN_VENV: no torchaudio pin for it in this script" ;;
esac

# --- pins: llamafactory and the closure it needs (pip's resolution of the packages above) --------
pins=(
  "llamafactory==0.9.5"
  "transformers==5.6.0" "datasets==4.0.0" "accelerate==1.11.0" "peft==0.18.1" "trl==0.24.0"
  "torchaudio==$torchaudio_version" "omegaconf==2.4.0"
  "tokenizers==0.22.2" "huggingface_hub==1.33.0" "hf-xet==1.8.0" "safetensors==0.8.0"
  "numpy==2.4.6" "pyarrow==26.0.1" "pandas==3.1.1" "python-dateutil==4.0.0" "tzdata==2026.6"
  "fsspec==2025.3.0" "dill==0.3.8" "multiprocess==0.70.16" "xxhash==4.1.0"
  "aiohttp==3.14.5" "aiohappyeyeballs==2.7.1" "aiosignal==1.4.0" "attrs==26.1.0"
  "frozenlist==1.8.0" "multidict==7.2.1" "propcache==0.5.4" "yarl==1.25.1"
  "requests==2.34.2" "urllib3==2.8.0" "certifi==2026.10.19.post1" "charset-normalizer==3.5.3"
  "idna==3.20" "httpx==0.29.0" "httpcore==1.0.9" "h11==0.16.0" "anyio==4.16.0"
  "filelock==4.3.2" "packaging==26.4" "PyYAML==6.0.4" "regex==2026.11.19" "tqdm==4.70.1"
  "psutil==7.2.2" "pydantic==2.14.4" "pydantic_core==2.50.5" "annotated-types==0.8.0"
  "typing-inspection==0.4.5" "typing_extensions==4.16.0" "annotated-doc==0.0.7"
  "typer==0.29.2" "click==8.5.1" "rich==15.0.0" "markdown-it-py==4.3.0" "mdurl==0.1.2"
  "Pygments==2.21.0" "shellingham==1.5.4"
  # torch's pure-Python dependencies (the borrowed torch imports them from venv-lf)
  "sympy==1.14.0" "mpmath==1.3.0" "networkx==3.6.1" "Jinja2==3.1.6" "MarkupSafe==3.0.4"
)

# --- venv ----------------------------------------------------------------------------------------
changed=0
if [[ ! -x "$venv/bin/python" ]]; then
  say "creating $venv (Python of $KILN_VENV)"
  "$KILN_VENV/bin/python" -m venv "$venv"
  changed=1
fi
sp="$(cd "$venv" && echo "$PWD"/lib/python3*/site-packages)"
[[ -d "$sp" ]] || die "no site-packages in $venv"

# --- borrowed torch: symlinks to the main venv's torch stack --------------------------------------
borrow="$venv/borrowed-torch"
want=()
for n in torch torchgen functorch triton nvidia cuda; do
  [[ -e "$main_sp/$n" ]] && want+=("$main_sp/$n")
done
for d in "$main_sp"/torch-*.dist-info "$main_sp"/triton-*.dist-info "$main_sp"/nvidia_*.dist-info \
  "$main_sp"/cuda_*.dist-info; do
  [[ -e "$d" ]] && want+=("$d")
done
have_links() {
  local t n
  [[ -d "$borrow" ]] || return 1
  for t in "${want[@]}"; do
    n="$borrow/$(basename "$t")"
    [[ -L "$n" && "$(readlink "$n")" == "$t" ]] || return 1
  done
  # no stale links (an older torch's dist-info, or a target that went away)
  for n in "$borrow"/*; do
    [[ -L "$n" && -e "$n" ]] || return 1
    [[ " ${want[*]} " == *" $(readlink "$n") "* ]] || return 1
  done
}
if ! have_links; then
  say "linking torch $torch_version from $main_sp"
  rm -rf "$borrow"
  mkdir -p "$borrow"
  for t in "${want[@]}"; do ln -s "$t" "$borrow/$(basename "$t")"; done
  changed=1
fi
pth="$sp/kiln-borrowed-torch.pth"
if [[ ! -f "$pth" || "$(cat "$pth")" != "$borrow" ]]; then
  printf '%s\n' "$borrow" >"$pth"
  changed=1
fi

# --- packages: install only the pins that are missing or at another version ----------------------
missing="$("$venv/bin/python" - "${pins[@]}" <<'EOF'
import importlib.metadata as md
import sys

out = []
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        if md.version(name) != version:
            out.append(spec)
    except md.PackageNotFoundError:
        out.append(spec)
print(" ".join(out))
EOF
)"
if [[ -n "$missing" ]]; then
  read -r -a to_install <<<"$missing"
  say "installing into $venv: ${to_install[*]}"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${to_install[@]}"
  changed=1
fi

# --- smoke test after any change: the modules the reference imports -----------------------------
if ((changed)); then
  say "checking imports"
  CUDA_VISIBLE_DEVICES="" "$venv/bin/python" -c '
import torch, transformers, datasets, llamafactory
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.train.pt.trainer import CustomTrainer
from llamafactory.train.tuner import run_exp
assert llamafactory.__version__ == "0.9.5", llamafactory.__version__
print("[setup-lf] llamafactory", llamafactory.__version__, "transformers", transformers.__version__,
      "datasets", datasets.__version__, "torch", torch.__version__, "from", torch.__file__.rsplit("/", 2)[0])
'
fi
say "ready: $venv/bin/python (llamafactory==0.9.5, torch $torch_version borrowed from $KILN_VENV)"
