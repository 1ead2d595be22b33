#!/usr/bin/env bash
# Makes a CUDA 12 nvcc folder from packages, for Horovod's GPU build on a machine with no
# CUDA toolkit (the GPU image's build stage on a Debian base: docker/Dockerfile.gpu):
#
#   bash launch/nvcc-cu12.sh DEST            then: GPU=1 NVCC_HOME=DEST bash launch/install.sh VENV
#
# PyPI has no CUDA 12 nvcc: nvidia-cuda-nvcc-cu12 (every release, 12.0 to 12.9) carries
# ptxas, the compiler's own headers (crt/) and NVVM (libnvvm, libdevice), not nvcc, cicc,
# cudafe++, fatbinary or nvlink. Debian's nvidia-cuda-toolkit (trixie, non-free: CUDA
# 12.4, NVIDIA's binaries repackaged; its ptxas is the wheel's byte for byte) carries
# those. The compiler programs come from that package, unpacked, not installed (it would
# bring a gigabyte of CUDA libraries TensorFlow's wheels already have), and the rest from
# the wheel of the same release, laid out as NVIDIA's toolkit is (bin/, nvvm/, include/,
# lib/), which install.sh's NVCC_HOME takes as it is. One more file goes with the
# compiler: the device runtime (libcudadevrt.a), which every CUDA link names and nvlink
# refuses when newer than itself (TensorFlow's runtime wheel has 12.9's); 12.4's is in
# Debian's nvidia-cuda-dev (900 MB, read for that file only: about 2 minutes here).
# Needs apt-get, dpkg-deb and pip; nothing is installed on the machine. DEBIAN_MIRROR=URL
# picks the mirror; PYTHON the pip's Python.
set -euo pipefail

DEST=${1:?usage: nvcc-cu12.sh DEST}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}

say() { printf 'nvcc-cu12: %s\n' "$*"; }
die() { printf 'nvcc-cu12: error: %s\n' "$*" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Trixie's non-free lists only, in a private apt state: the machine's own sources, lists
# and installed packages stay as they are.
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
echo "deb $DEBIAN_MIRROR trixie non-free" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root)
say "Debian trixie's nvidia-cuda-toolkit from $DEBIAN_MIRROR"
apt-get "${apt_opts[@]}" update -qq || die "apt-get cannot read trixie non-free from $DEBIAN_MIRROR (DEBIAN_MIRROR=URL picks another mirror)"
(cd "$work/debs" && apt-get "${apt_opts[@]}" download -qq nvidia-cuda-toolkit nvidia-cuda-dev) \
    || die "cannot download nvidia-cuda-toolkit and nvidia-cuda-dev from $DEBIAN_MIRROR trixie non-free"
deb=$(ls "$work"/debs/nvidia-cuda-toolkit_*.deb)
dpkg-deb -x "$deb" "$work/deb"
dpkg-deb --fsys-tarfile "$work"/debs/nvidia-cuda-dev_*.deb \
    | tar -x -C "$work/deb" --wildcards '*/libcudadevrt.a'
# 12.4.131~12.4.1-2: CUDA 12.4.1, whose nvcc is 12.4.131, the wheel's version too.
release=$(dpkg-deb -f "$deb" Version | sed 's/~.*//')
rm -f "$work"/debs/*.deb
[ "${release%%.*}" = 12 ] || die "Debian's nvidia-cuda-toolkit is CUDA $release, not 12"

say "nvidia-cuda-nvcc-cu12==$release from PyPI (the compiler's headers and NVVM)"
"$PYTHON" -m pip download -q --no-deps -d "$work/wheel" "nvidia-cuda-nvcc-cu12==$release" \
    || die "cannot download nvidia-cuda-nvcc-cu12==$release"
"$PYTHON" -m zipfile -e "$work"/wheel/nvidia_cuda_nvcc_cu12-*.whl "$work/wheel"
wheel=$work/wheel/nvidia/cuda_nvcc
tools=$work/deb/usr/lib/nvidia-cuda-toolkit

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/nvvm/bin" "$DEST/include" "$DEST/lib"
# Debian's /usr/bin/nvcc is a wrapper script; the compiler driver itself is in $tools.
cp "$tools/bin/nvcc" "$DEST/bin/"
cp -r "$tools/bin/crt" "$DEST/bin/"
cp "$tools/bin/cicc" "$DEST/nvvm/bin/"
for tool in cudafe++ fatbinary nvlink bin2c ptxas; do cp "$work/deb/usr/bin/$tool" "$DEST/bin/"; done
cp -r "$wheel/nvvm/lib64" "$wheel/nvvm/libdevice" "$DEST/nvvm/"
cp -r "$wheel/include/crt" "$wheel/include/fatbinary_section.h" "$DEST/include/"
cp "$work"/deb/usr/lib/*/libcudadevrt.a "$DEST/lib/"
# NVIDIA's own profile (Debian's points at /usr): everything relative to bin/, so the
# links install.sh makes to these files find the headers and libraries of its folder.
cat > "$DEST/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib:
PATH            += $(CICC_PATH):$(_HERE_):
INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
"$DEST/bin/nvcc" --version | grep -q "release ${release%.*}," || die "$DEST/bin/nvcc does not run"
say "CUDA $release nvcc in $DEST"
