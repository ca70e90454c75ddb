#!/usr/bin/env bash
# Copies the headers, CMake/pkg-config files and shared libraries of kiln's Debian-packaged C++
# dependencies (scripts/setup.sh installs them here) into .deps/usr, an ignored folder, so that a
# machine without those packages and without network (the GPU machine of scripts/device_check.sh)
# can configure and build kiln against them: pass the folder as carried path and point
# CMAKE_PREFIX_PATH at it. Only files under /usr/include, /usr/lib and /usr/share/{cmake,pkgconfig}
# and pkgconf (pkg-config finds PCRE2) are taken; the result is a few MiB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.deps"
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
echo "bundle_deps: $(du -sh "$dest" | cut -f1) in $dest"
