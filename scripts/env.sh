# Sourced by the build scripts: where LibTorch and the Python reference environment live.
# A user's own LibTorch wins: export Torch_DIR=/path/to/libtorch/share/cmake/Torch before building.
KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"
KILN_PYTHON="${KILN_PYTHON:-$KILN_HOME/venv/bin/python}"
if [[ -z "${Torch_DIR:-}" ]]; then
  for d in "$KILN_HOME"/venv/lib/python3*/site-packages/torch/share/cmake/Torch; do
    [[ -f "$d/TorchConfig.cmake" ]] && Torch_DIR="$d"
  done
fi
export KILN_HOME KILN_PYTHON Torch_DIR
