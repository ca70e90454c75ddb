#!/usr/bin/env bash
# CTest's `consumer` test (docs/embedding.md): install kiln into a temporary prefix, check what was
# installed (no libpython anywhere, libkiln.so exports only the API), build tests/consumer against
# the installed package alone, make a checkpoint with the installed kiln-pretrain, and run the
# service on it. Also: the package refuses a LibTorch of another version, naming both.
# Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/kiln-consumer.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
say() { printf 'consumer: %s\n' "$*"; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
lib="$(ls "$prefix"/lib*/libkiln.so.* | head -1)"
say "installed $(cd "$prefix" && find . -type f | wc -l) files; $(readelf -d "$lib" | grep SONAME | sed 's/.*\[\(.*\)\]/SONAME \1/')"
for f in "$lib" "$prefix"/bin/kiln-*; do
  if readelf -d "$f" | grep NEEDED | grep -qi "libpython" || ldd "$f" | grep -qi "libpython"; then
    echo "consumer: $f needs libpython" >&2
    exit 1
  fi
done
# The dynamic symbol table is the API: every defined symbol is in namespace kiln.
exported="$(nm -D --defined-only -C "$lib" | awk '{ $1 = ""; $2 = ""; print }' | sed 's/^ *//')"
if echo "$exported" | grep -v -E '^(typeinfo (name )?for |vtable for )?kiln::' | grep -q .; then
  echo "consumer: libkiln.so exports more than the API:" >&2
  echo "$exported" | grep -v -E '^(typeinfo (name )?for |vtable for )?kiln::' | head >&2
  exit 1
fi
say "libkiln.so exports $(echo "$exported" | wc -l) symbols, all kiln::"
for h in kiln/kiln.h kiln/export.h kiln/version.h kiln/train/pretrain_config.h; do
  [[ -f "$prefix/include/$h" ]] || { echo "consumer: $h not installed" >&2; exit 1; }
done
if [[ -e "$prefix/include/kiln/model/llama.h" ]]; then echo "consumer: internal headers installed" >&2; exit 1; fi

# An outside project: its own CMakeLists.txt, only find_package(kiln).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  "${launcher[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
say "built the service against $prefix"

# A checkpoint from the installed program, continued by the service.
timeout 300 "$prefix/bin/kiln-pretrain" --max_steps 2 --save_steps 0 --eval_steps 0 --logging_steps 1 \
  --output_dir "$work/pretrain" >"$work/pretrain.log" 2>&1 || { cat "$work/pretrain.log" >&2; exit 1; }
timeout 300 "$work/build/service" "$work/pretrain/checkpoint-2" "$work/service" >"$work/service.out"
cat "$work/service.out"
# kiln wrote nothing to stdout (its log went to the service's handler): one line, the service's.
[[ "$(wc -l <"$work/service.out")" == 1 ]] || { echo "consumer: kiln wrote to stdout" >&2; exit 1; }

# Another LibTorch version is refused at configure time, naming both versions.
mkdir -p "$work/faketorch"
echo 'set(TORCH_INSTALL_PREFIX "/nowhere")' >"$work/faketorch/TorchConfig.cmake"
printf 'set(PACKAGE_VERSION "2.10.0")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' >"$work/faketorch/TorchConfigVersion.cmake"
if cmake -S "$src/tests/consumer" -B "$work/build-other" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DTorch_DIR="$work/faketorch" >"$work/other.log" 2>&1; then
  echo "consumer: a LibTorch 2.10.0 was accepted" >&2
  exit 1
fi
grep -q "built against LibTorch" "$work/other.log" && grep -q "2.10.0" "$work/other.log" ||
  { cat "$work/other.log" >&2; exit 1; }
say "LibTorch 2.10.0 refused: $(grep -o 'kiln [0-9.]* was built against LibTorch [0-9.]*' "$work/other.log" | head -1)"
