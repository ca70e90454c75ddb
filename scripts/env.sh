# Sourced by the build scripts: where LibTorch, its Python reference environment and the nvcc that
# matches it live (scripts/setup.sh records its choice in $KILN_HOME/selected.env).
# A user's own LibTorch wins: export Torch_DIR=/path/to/libtorch/share/cmake/Torch before building.
KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"
KILN_VENV="$KILN_HOME/venv"
KILN_SELECTED_CUDACXX=""
selected="$KILN_HOME/selected.env"
[[ -n "${KILN_CUDA:-}" && -f "$KILN_HOME/selected-cu$KILN_CUDA.env" ]] && selected="$KILN_HOME/selected-cu$KILN_CUDA.env"
if [[ -f "$selected" ]]; then
  # shellcheck source=/dev/null
  source "$selected"
fi
KILN_PYTHON="${KILN_PYTHON:-$KILN_VENV/bin/python}"
if [[ -z "${Torch_DIR:-}" ]]; then
  for d in "$KILN_VENV"/lib/python3*/site-packages/torch/share/cmake/Torch; do
    [[ -f "$d/TorchConfig.cmake" ]] && Torch_DIR="$d"
  done
fi
if [[ -z "${CUDACXX:-}" && -n "$KILN_SELECTED_CUDACXX" ]]; then
  CUDACXX="$KILN_SELECTED_CUDACXX"
fi
export KILN_HOME KILN_PYTHON Torch_DIR
if [[ -n "${CUDACXX:-}" ]]; then export CUDACXX; fi
