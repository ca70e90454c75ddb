#!/usr/bin/env bash
# Puts a CUDA 12 toolkit (nvcc, ptxas, headers, libraries) into ${KILN_HOME:-$HOME/.cache/kiln}/cuda-12,
# outside the checkout and without touching the system: Debian's own packaging of NVIDIA's CUDA
# 12.4 (nvidia-cuda-toolkit and nvidia-cuda-dev, non-free, Debian 13 "trixie"; they need glibc
# 2.34, so they run on Debian 12), fetched with a private package list (apt-get download, dpkg -x;
# no apt source of the system is changed, nothing is installed) from the Debian mirror the system
# already uses. It is then laid out as NVIDIA's tarballs are (bin/, nvvm/, include/, lib64/), so
# CMake, LibTorch's CMake files and nvcc find their pieces from its root.
#
# What for: PyPI's torch==2.10.0 is a CUDA 12.8 build (cu128), the one LibTorch that runs on a
# V100 (sm_70) and on drivers older than CUDA 13; kiln's kernels must then be compiled by a CUDA 12
# nvcc (CUDA 13 no longer targets sm_70). scripts/setup.sh calls this when KILN_CUDA=12 finds no
# CUDA 12 toolkit on the machine. Idempotent: a second run prints the root and does nothing.
#
#   scripts/fetch_cuda12.sh        prints the toolkit's root (its bin/nvcc is the compiler)
set -euo pipefail
KILN_HOME="${KILN_HOME:-$HOME/.cache/kiln}"
root="$KILN_HOME/cuda-12"
say() { printf '[cuda-12] %s\n' "$*" >&2; }

if [[ -x "$root/bin/nvcc" && -f "$root/.complete" ]]; then
  echo "$root"
  exit 0
fi

# The mirror this system's apt uses (its deb822 or one-line sources), for Debian's own packages.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f "$f" ]] || continue
  mirror="$(awk '/^URIs:/ {for (i = 2; i <= NF; ++i) if ($i !~ /security/) {print $i; exit}}' "$f")"
  [[ -n "$mirror" ]] && break
done
if [[ -z "$mirror" && -f /etc/apt/sources.list ]]; then
  mirror="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; ++i) if ($i ~ /:\/\//) {print $i; exit}}' /etc/apt/sources.list)"
fi
[[ -n "$mirror" ]] || {
  echo "[cuda-12] error: no Debian mirror in /etc/apt/sources.list(.d): install a CUDA 12 toolkit and set CUDACXX" >&2
  exit 1
}

work="$KILN_HOME/cuda-12.download"
rm -rf "$work" "$root"
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/tree"
cat >"$work/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main contrib non-free
EOF
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o Debug::NoLocking=1
  -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
say "reading the package list of $mirror trixie non-free"
apt-get "${apt_opts[@]}" -qq update
# nvcc and its tools, the headers and libraries LibTorch's CMake files look for, libdevice, CUB/Thrust.
packages=(nvidia-cuda-toolkit nvidia-cuda-dev libcudart12 libnvvm4 libcublas12 libcublaslt12 libnvrtc12 libcufft11
  libcurand10 libcusolver11 libcusparse12 libnvjitlink12 libnvtoolsext1 libcu++-dev libcub-dev libthrust-dev)
say "downloading ${packages[*]} (about 1.7 GB, once)"
(cd "$work/archives" && apt-get "${apt_opts[@]}" -qq download "${packages[@]/%//trixie}")
for deb in "$work/archives"/*.deb; do dpkg -x "$deb" "$work/tree"; done
find "$work/tree" -name '*.a' -delete  # static libraries: kiln links the shared ones (saves 2 GB)

# NVIDIA's layout over Debian's files.
deb="$work/tree/usr"
mkdir -p "$root/bin" "$root/nvvm/bin"
mv "$work/tree" "$root/debian"
deb="$root/debian/usr"
for tool in nvcc cicc; do ln -s "$deb/lib/nvidia-cuda-toolkit/bin/$tool" "$root/bin/$tool"; done
ln -s "$deb/lib/nvidia-cuda-toolkit/bin/cicc" "$root/nvvm/bin/cicc"
ln -s "$deb/lib/nvidia-cuda-toolkit/bin/crt" "$root/bin/crt"
for tool in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvdisasm nvprune cu++filt; do
  [[ -e "$deb/bin/$tool" ]] && ln -s "$deb/bin/$tool" "$root/bin/$tool"
done
ln -s "$deb/lib/nvidia-cuda-toolkit/libdevice" "$root/nvvm/libdevice"
ln -s "$deb/include" "$root/include"
ln -s "$deb/lib/x86_64-linux-gnu" "$root/lib64"
cat >"$root/bin/nvcc.profile" <<'EOF'
# kiln's relocatable profile for Debian's CUDA 12 files (scripts/fetch_cuda12.sh).
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
# A one-line probe: the compiler runs and targets sm_70 and sm_80.
probe="$work/probe.cu"
printf '__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n' >"$probe"
"$root/bin/nvcc" -c "$probe" -o "$work/probe.o" -gencode arch=compute_70,code=sm_70 -gencode arch=compute_80,code=sm_80 \
  -Wno-deprecated-gpu-targets >/dev/null
version="$("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
rm -rf "$work"
touch "$root/.complete"
say "CUDA $version toolkit ready"
echo "$root"
