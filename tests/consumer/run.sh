#!/usr/bin/env bash
# CTest's `consumer` test (docs/embedding.md): install kiln into a temporary prefix, check what was
# installed (SONAME and links, no libpython anywhere, libkiln.so exports exactly the API), build
# tests/consumer against the installed package alone, make a checkpoint with the installed
# kiln-pretrain, run the service on it, and run api_check. Also: the package refuses a LibTorch of
# another version, naming both.
# Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/kiln-consumer.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
say() { printf 'consumer: %s\n' "$*"; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
# The library is installed under its full version, with its SONAME (major.minor while the version is
# 0.x: the package is compatible within a minor version) and the two links to it.
libdir="$(cd "$(echo "$prefix"/lib*/cmake/kiln)/../.." && pwd)"
version="$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$libdir/cmake/kiln/kilnConfigVersion.cmake")"
lib="$libdir/libkiln.so.$version"
[[ -n "$version" && -f "$lib" && ! -L "$lib" ]] || { echo "consumer: libkiln.so.$version not installed" >&2; exit 1; }
soname_want="libkiln.so.${version%.*}"
dynamic="$(readelf -d "$lib")"
soname="$(sed -n 's/.*(SONAME) *Library soname: \[\(.*\)\]/\1/p' <<<"$dynamic")"
[[ "$soname" == "$soname_want" ]] || { echo "consumer: SONAME is '$soname', want $soname_want" >&2; exit 1; }
for link in "$libdir/$soname_want" "$libdir/libkiln.so"; do
  [[ -L "$link" && "$(readlink -f "$link")" == "$(readlink -f "$lib")" ]] ||
    { echo "consumer: $link is not a link to libkiln.so.$version" >&2; exit 1; }
done
say "installed $(cd "$prefix" && find . -type f | wc -l) files; libkiln.so.$version, SONAME $soname"
for f in "$lib" "$prefix"/bin/kiln-*; do
  needed="$(readelf -d "$f")" resolved="$(ldd "$f")"
  if [[ "$needed" == *libpython* || "$resolved" == *libpython* ]]; then
    echo "consumer: $f needs libpython" >&2
    exit 1
  fi
done

# The dynamic symbol table is the API, exactly. The demangled names of the defined dynamic symbols
# equal tests/consumer/exported_symbols.txt (an API change updates it in the same commit: `nm -D
# --defined-only libkiln.so | awk 'NF == 3 { print $3 }' | c++filt | LC_ALL=C sort -u`), except
# the member functions of the settings struct (KILN_API as a whole), each of which must be declared
# in the installed train/pretrain_config.h. And, so that a list regenerated in haste cannot let
# internals through: every name is in namespace kiln, outside its internal namespaces (kiln::train
# is internal but for what train/pretrain_config.h declares), and each word of its qualified name is
# in the installed headers. The count is the names plus a second symbol per constructor/destructor
# (GCC's complete- and base-object variants), nothing more.
raw="$(nm -D --defined-only "$lib")"
mangled="$(awk 'NF == 3 { print $3 }' <<<"$raw")"
count="$(wc -l <<<"$mangled")"
exported="$(c++filt <<<"$mangled" | LC_ALL=C sort -u)"
settings_member='^kiln::train::PretrainConfig::'
expected="$(grep -v "$settings_member" "$src/tests/consumer/exported_symbols.txt" | LC_ALL=C sort -u)"
listed="$(grep -v "$settings_member" <<<"$exported" || true)"
if [[ "$listed" != "$expected" ]]; then
  echo "consumer: libkiln.so's exported symbols differ from tests/consumer/exported_symbols.txt (< listed, > exported):" >&2
  diff <(echo "$expected") <(echo "$listed") >&2 || true
  exit 1
fi
headers="$(cat "$prefix"/include/kiln/*.h "$prefix"/include/kiln/*/*.h)"
settings_header="$(cat "$prefix/include/kiln/train/pretrain_config.h")"
public_train='^kiln::train::(PretrainConfig|load_pretrain_config|parse_overrides|pretrain_config_from_yaml_text|pretrain_config_keys|pretrain_config_json|resolve_steps)\b'
structors=0
while IFS= read -r sym; do
  name="$(sed -E 's/^(typeinfo name for |typeinfo for |vtable for )//; s/\[abi:[a-z0-9]*\]//g; s/\(.*//' <<<"$sym")"
  if [[ ! "$name" =~ ^kiln:: ]] ||
    { [[ "$name" =~ ^kiln::(model|data|ops|optim|dist|io|config|profile|kernels|common|detail|internal|train):: ]] &&
      ! grep -Eq "$public_train" <<<"$name"; }; then
    echo "consumer: libkiln.so exports an internal symbol: $sym" >&2
    exit 1
  fi
  IFS=':' read -ra parts <<<"${name#kiln::}"
  for part in "${parts[@]}"; do
    [[ -z "$part" ]] && continue
    grep -Fqw -- "${part#\~}" <<<"$headers" || { echo "consumer: exported $sym: '$part' is in no installed header" >&2; exit 1; }
  done
  if [[ "$name" =~ $settings_member ]] && ! grep -Eq "\b${name##*::}\(" <<<"$settings_header"; then
    echo "consumer: exported $sym is not declared in the installed train/pretrain_config.h" >&2
    exit 1
  fi
  if [[ "${#parts[@]}" -ge 3 && "${parts[-1]#\~}" == "${parts[-3]}" ]]; then structors=$((structors + 1)); fi
done <<<"$exported"
api_count="$(wc -l <<<"$exported")"
if ((count > api_count + structors)); then
  echo "consumer: libkiln.so exports $count symbols for $api_count API names ($structors constructors/destructors)" >&2
  exit 1
fi
say "libkiln.so exports $count symbols: $api_count API names ($(wc -l <<<"$expected") listed in" \
  "exported_symbols.txt, $((api_count - $(wc -l <<<"$expected"))) settings members) + $structors constructors'/destructors' twins"
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
say "built the service and api_check against $prefix"

# A checkpoint from the installed program, continued by the service.
timeout 300 "$prefix/bin/kiln-pretrain" --max_steps 2 --save_steps 0 --eval_steps 0 --logging_steps 1 \
  --output_dir "$work/pretrain" >"$work/pretrain.log" 2>&1 || { cat "$work/pretrain.log" >&2; exit 1; }
timeout 300 "$work/build/service" "$work/pretrain/checkpoint-2" "$work/service" >"$work/service.out"
cat "$work/service.out"
# kiln wrote nothing to stdout (its log went to the service's handler): one line, the service's.
[[ "$(wc -l <"$work/service.out")" == 1 ]] || { echo "consumer: kiln wrote to stdout" >&2; exit 1; }
# The API's other entry points (models from a preset and a YAML, save_pretrained, evaluate, kOff).
timeout 300 "$work/build/api_check" "$work/api" >"$work/api.out" || { cat "$work/api.out"; exit 1; }
cat "$work/api.out"

# Another LibTorch version is refused at configure time, naming both versions. "Another" is one
# this build was not made with: kiln builds against torch 2.11.0 and 2.10.0 (KILN_CUDA=12).
built_with="$(sed -n 's/^set(KILN_TORCH_VERSION "\(.*\)")$/\1/p' "$libdir/cmake/kiln/kilnConfig.cmake")"
other="2.10.0"
[[ "$built_with" == 2.10.* ]] && other="2.11.0"
mkdir -p "$work/faketorch"
echo 'set(TORCH_INSTALL_PREFIX "/nowhere")' >"$work/faketorch/TorchConfig.cmake"
printf 'set(PACKAGE_VERSION "%s")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' "$other" >"$work/faketorch/TorchConfigVersion.cmake"
if cmake -S "$src/tests/consumer" -B "$work/build-other" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DTorch_DIR="$work/faketorch" >"$work/other.log" 2>&1; then
  echo "consumer: a LibTorch $other was accepted by kiln built against ${built_with:-?}" >&2
  exit 1
fi
grep -q "built against LibTorch" "$work/other.log" && grep -q "$other" "$work/other.log" ||
  { cat "$work/other.log" >&2; exit 1; }
refusal="$(grep -o 'kiln [0-9.]* was built against LibTorch [0-9.]*' "$work/other.log" || true)"
say "LibTorch $other refused: ${refusal%%$'\n'*}"
