#!/usr/bin/env bash
# The main-job command of README.md: set up, build, then run the main job on the embedded default:
# kiln-pretrain with configs/pretrain/quickstart.yaml (the tiny preset on the embedded corpus,
# about a minute on 2 CPU cores), then a sample from the checkpoint it wrote. Arguments go to
# kiln-pretrain (e.g. --max_steps 100).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
bin="${KILN_BUILD_DIR:-$root/build${KILN_CUDA:+-cu$KILN_CUDA}}/bin"
"$bin/kiln-pretrain" --output_dir output/quickstart "$@"
ckpt="$(ls -d output/quickstart/checkpoint-* | sort -t- -k2 -n | tail -n 1)"
echo "--- sample from $ckpt (kiln-generate --greedy):"
"$bin/kiln-generate" --model "$ckpt" --prompt "The " --max-new-tokens 120 --greedy
