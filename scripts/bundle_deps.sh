#!/usr/bin/env bash
# Copies the headers, CMake/pkg-config files and shared libraries of kiln's Debian-packaged C++
# dependencies (scripts/setup.sh installs them here) into .deps/usr, an ignored folder, so that a
# machine without those packages and without network (the GPU machine of scripts/device_check.sh)
# can configure and build kiln against them: pass the folder as carried path and point
# CMAKE_PREFIX_PATH at it. Only files under /usr/include, /usr/lib and /usr/share/{cmake,pkgconfig}
# and pkgconf (pkg-config finds PCRE2) are taken; the result is a few MiB.
#
#   scripts/bundle_deps.sh [--prebuilt BUILD_DIR] [--no-python]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.deps"
prebuilt_from=""
python_part=1
while (($#)); do
  case "$1" in
    --prebuilt) prebuilt_from="$(cd "$2" && pwd)"; shift 2 ;;
    --no-python) python_part=0; shift ;;
    *) echo "usage: scripts/bundle_deps.sh [--prebuilt BUILD_DIR] [--no-python]" >&2; exit 2 ;;
  esac
done
dev_packages=(libfmt-dev libspdlog-dev libyaml-cpp-dev libcxxopts-dev catch2 nlohmann-json3-dev libpcre2-dev
  libbenchmark-dev libgloo-dev)  # libgloo-dev: headers only (c10d Gloo, kiln/dist/comm.cpp)
# The runtime libraries the -dev packages' .so links point to, and pkg-config itself.
runtime_packages=(libfmt9 libspdlog1.10 libyaml-cpp0.7 libbenchmark1debian libpcre2-8-0 libpkgconf3 pkgconf-bin)

rm -rf "$dest"
mkdir -p "$dest"
for pkg in "${dev_packages[@]}" "${runtime_packages[@]}"; do
  if ! dpkg -s "$pkg" >/dev/null 2>&1; then
    echo "bundle_deps: package $pkg is not installed here (scripts/setup.sh installs it)" >&2
    exit 1
  fi
  dpkg -L "$pkg" | while read -r f; do
    [[ -f "$f" || -L "$f" ]] || continue
    case "$f" in
      /usr/include/* | /usr/lib/* | /usr/share/cmake/* | /usr/share/pkgconfig/* | /usr/bin/pkgconf) ;;
      *) continue ;;
    esac
    mkdir -p "$dest$(dirname "$f")"
    cp -a "$f" "$dest$f"
  done
done
ln -sf pkgconf "$dest/usr/bin/pkg-config"

# The Python side of scripts/bench_vs_hf.py, for a GPU machine whose python3 has torch but not
# transformers: the reference venv's transformers (its Llama and auto modules only) and what it
# imports besides torch and numpy, into .deps/python; device_check.sh appends the folder to
# PYTHONPATH only when its own python3 cannot import transformers. Compiled ones (tokenizers,
# safetensors: abi3; regex: this venv's Python version) may not load elsewhere: the benchmark step
# then reports that it was skipped.
source "$root/scripts/env.sh"
if ((python_part)) && [[ -x "$KILN_PYTHON" ]]; then
  site="$("$KILN_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pydest="$dest/python"
  mkdir -p "$pydest"
  for pkg in transformers huggingface_hub tokenizers safetensors filelock packaging regex tqdm yaml jinja2 \
    markupsafe anyio h11 httpcore2 httpx2 idna truststore; do
    [[ -e "$site/$pkg" ]] || continue
    if [[ "$pkg" == transformers ]]; then
      tar -C "$site" --exclude=__pycache__ --exclude='transformers/models/*' -cf - transformers | tar -C "$pydest" -xf -
      tar -C "$site" --exclude=__pycache__ -cf - transformers/models/__init__.py transformers/models/llama \
        transformers/models/auto | tar -C "$pydest" -xf -
    else
      tar -C "$site" --exclude=__pycache__ -cf - "$pkg" | tar -C "$pydest" -xf -
    fi
  done
  # Their metadata: transformers and huggingface_hub check the versions of what they import.
  for dist in transformers huggingface_hub tokenizers safetensors filelock packaging regex tqdm pyyaml jinja2 \
    markupsafe anyio h11 httpcore2 httpx2 idna truststore; do
    for info in "$site/$dist"-*.dist-info; do
      [[ -d "$info" ]] && cp -a "$info" "$pydest/"
    done
  done
  echo "bundle_deps: $(du -sh "$pydest" | cut -f1) of Python packages in $pydest"
fi

# --prebuilt BUILD_DIR: the programs device_check.sh runs (kiln-hf for scripts/bench_vs_hf.py), built here for the GPU machine (a build
# folder configured with -DKILN_CUDA=ON -DKILN_BUILD_TESTS=ON -DKILN_PARQUET=OFF and that GPU's
# CMAKE_CUDA_ARCHITECTURES), stripped, into .deps/prebuilt/{bin,tests}, with the shared libraries
# they load that are neither LibTorch's (the GPU machine's own torch wheel provides those, the same
# version) nor the C and C++ runtimes, into .deps/prebuilt/lib: the GPU machine then spends no
# time compiling. source_root records this checkout's path: the tests find their fixtures there
# (KILN_TEST_FIXTURES), and device_check.sh links that path to its own checkout.
if [[ -n "$prebuilt_from" ]]; then
  pre="$dest/prebuilt"
  mkdir -p "$pre/bin" "$pre/tests" "$pre/lib"
  for p in bin/kiln-bench bin/kiln-hf bin/kiln-profile bin/kiln-pretrain tests/kiln_tests; do
    [[ -x "$prebuilt_from/$p" ]] || { echo "bundle_deps: $prebuilt_from/$p is not built" >&2; exit 1; }
    strip -o "$pre/$p" "$prebuilt_from/$p"
  done
  for p in "$pre"/bin/* "$pre"/tests/*; do ldd "$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
      case "$(basename "$lib")" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libresolv.so* | ld-linux* | \
          libstdc++.so* | libgcc_s.so* | libcuda.so* | libutil.so* | libz.so*) continue ;;
      esac
      case "$lib" in */torch/lib/* | */nvidia/* | */pyarrow/*) continue ;; esac
      strip -o "$pre/lib/$(basename "$lib")" "$lib"
    done
  echo "$root" >"$pre/source_root"
  echo "bundle_deps: $(du -sh "$pre" | cut -f1) of prebuilt programs and their libraries in $pre"
fi
echo "bundle_deps: $(du -sh "$dest" | cut -f1) in $dest"
