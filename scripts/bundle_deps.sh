#!/usr/bin/env bash
# Copies the headers, CMake/pkg-config files and shared libraries of kiln's Debian-packaged C++
# dependencies (scripts/setup.sh installs them here) into .deps/usr, an ignored folder, so that a
# machine without those packages and without network (the GPU machine of scripts/device_check.sh)
# can configure and build kiln against them: pass the folder as carried path and point
# CMAKE_PREFIX_PATH at it. Only files under /usr/include, /usr/lib and /usr/share/{cmake,pkgconfig}
# and pkgconf (pkg-config finds PCRE2) are taken; the result is a few MiB.
#
#   scripts/bundle_deps.sh [--prebuilt BUILD_DIR] [--no-python] [--sanitizer]
#
# The device tool carries at most 64 MiB, the checkout's tracked files included: the last line
# says how much .deps and the checkout hold together.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.deps"
prebuilt_from=""
python_part=1
sanitizer=0
while (($#)); do
  case "$1" in
    --prebuilt) prebuilt_from="$(cd "$2" && pwd)"; shift 2 ;;
    --no-python) python_part=0; shift ;;
    --sanitizer) sanitizer=1; shift ;;
    *) echo "usage: scripts/bundle_deps.sh [--prebuilt BUILD_DIR] [--no-python] [--sanitizer]" >&2; exit 2 ;;
  esac
done
dev_packages=(libfmt-dev libspdlog-dev libyaml-cpp-dev catch2 nlohmann-json3-dev libpcre2-dev
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
# (KILN_TEST_FIXTURES), and device_check.sh links that path to its own checkout. The folder travels
# packed, as .deps/prebuilt.tar.xz (47 MB of stripped programs and libraries pack to about 10 MB,
# which leaves room in the device tool's 64 MiB for compute-sanitizer); device_check.sh unpacks it
# into build-prebuilt/ there (a second or two; ignored, so never carried).
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
  echo "bundle_deps: $(du -sh "$pre" | cut -f1) of prebuilt programs and their libraries, packed into $dest/prebuilt.tar.xz"
  tar -C "$dest" -cf - prebuilt | xz -T0 -6 >"$dest/prebuilt.tar.xz"
  rm -rf "$pre"
fi

# --sanitizer: compute-sanitizer for a GPU machine whose CUDA has none: PyPI's
# nvidia-cuda-sanitizer-api wheel of CUDA 13.0 (the H200 machine's driver runs CUDA 13.0), 14 MB
# as it comes (41 MB unpacked), into .deps/compute-sanitizer.whl; device_check.sh unpacks it there
# only when it finds no compute-sanitizer of the machine's own.
if ((sanitizer)); then
  tmp="$(mktemp -d)"
  "$KILN_PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" nvidia-cuda-sanitizer-api==13.0.85
  mv "$tmp"/nvidia_cuda_sanitizer_api-*.whl "$dest/compute-sanitizer.whl"
  rm -rf "$tmp"
  echo "bundle_deps: $(du -sh "$dest/compute-sanitizer.whl" | cut -f1) of compute-sanitizer in $dest/compute-sanitizer.whl"
fi
echo "bundle_deps: $(du -sh "$dest" | cut -f1) in $dest"
# What the device tool sends: the tracked files and .deps (64 MiB at most).
tracked="$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -n 1 | cut -f1)"
total=$(( $(du -sb "$dest" | cut -f1) + ${tracked:-0} ))
echo "bundle_deps: $((total / 1048576)) MiB with the checkout's tracked files (the device tool carries at most 64 MiB)"
if ((total > 64 * 1048576)); then
  echo "bundle_deps: warning: over 64 MiB: leave out --sanitizer where the GPU machine has compute-sanitizer, or the Python part (--no-python)" >&2
fi
