#!/usr/bin/env bash
# Installs everything hvdtrain needs into a virtualenv; safe to run again. `make setup`,
# CI and both Docker images (docker/Dockerfile.cpu, docker/Dockerfile.gpu) run this.
#
#   bash launch/install.sh [VENV]           CPU: tensorflow-cpu, Horovod with Gloo
#   PYTHON=python3.12 bash launch/install.sh [VENV]
#                                           the interpreter for a new VENV (3.10 to 3.12;
#                                           default python3)
#   GPU=1 bash launch/install.sh [VENV]     GPU: tensorflow[and-cuda], Horovod with NCCL for
#                                           GPU tensors (needs a CUDA 12 toolkit and NCCL
#                                           headers, or NVCC_HOME: see "GPU" below)
#   MPI=1 ...                               also Horovod's MPI controller (needs Open MPI's mpicxx)
#   DEPS_ONLY=1 ...                         TensorFlow and Horovod only, not hvdtrain itself
#                                           (a Docker layer that survives code changes)
#   CODE_ONLY=1 ...                         hvdtrain only, into a VENV that has TensorFlow and
#                                           Horovod already (built elsewhere: the GPU image's
#                                           last stage, which has no compilers); it checks
#                                           Horovod's features (GPU=1: NCCL) and builds nothing
#
# TF_VERSION and HOROVOD_VERSION override the pinned versions below (the Dockerfiles
# pass theirs as build ARGs). Horovod's own build variables (HOROVOD_CUDA_HOME,
# HOROVOD_NCCL_HOME, HOROVOD_BUILD_CUDA_CC_LIST, ...) pass through to its build.
#
# GPU: TensorFlow 2.21 runs on CUDA 12 (its and-cuda extra pins the nvidia-*-cu12 wheels).
# A CUDA 12 toolkit with NCCL's headers (HOROVOD_CUDA_HOME, else /usr/local/cuda, as in the
# Docker image's devel base) is used as it is. NVCC_HOME=DIR instead takes CUDA's headers,
# runtime and NCCL from those wheels in VENV and only the compiler from DIR/bin/nvcc:
# PyPI has no CUDA 12 nvcc (nvidia-cuda-nvcc-cu12 ships ptxas and libnvvm only), just
# CUDA 13's (nvidia-cuda-nvcc), whose kernels need a CUDA 13 driver and leave out V100
# (sm_70). `make check-gpu-build` builds that way to prove the GPU build compiles.
#
# Horovod 0.28.1 is the last release and does not build against TensorFlow 2.21 as it
# is, so it is built from its PyPI sdist with the patches in launch/patches/ (each says
# what it fixes and what it follows). Order matters: Horovod compiles against the
# TensorFlow already installed, so it needs TF first and pip's --no-build-isolation.
# The built wheel is kept in HVDTRAIN_WHEEL_CACHE (default ~/.cache/hvdtrain/wheels),
# one per Horovod, TensorFlow, Python, build flavour and patch set, so a second install
# (a new venv, CI) takes seconds, not minutes.
set -euo pipefail

VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
TF_VERSION=${TF_VERSION:-2.21.0}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
GPU=${GPU:-0}
MPI=${MPI:-0}
CODE_ONLY=${CODE_ONLY:-0}
DATA_DIR=/usr/share/datasets/fashion-mnist
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATCH_DIR=$LAUNCH_DIR/patches
WHEEL_CACHE=${HVDTRAIN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdtrain/wheels}

say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else return 1; fi; }

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq || return 1; apt_updated=1; fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- data: Debian ships Fashion-MNIST as IDX files ---
if [ ! -d "$DATA_DIR" ]; then
    say "Fashion-MNIST missing; installing dataset-fashion-mnist"
    apt_install dataset-fashion-mnist \
        || say "could not install it (not root?): run 'sudo apt-get install -y dataset-fashion-mnist' or pass --data-dir"
fi

# --- sshd for `hvdtrain cluster` (emulated hosts reached over ssh; started only there) ---
if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    say "sshd missing; installing openssh-server for hvdtrain cluster"
    # Installed without starting it: the cluster starts an sshd inside each emulated
    # host, and the machine's own must not open port 22 because we installed the package.
    bash "$LAUNCH_DIR/install-packages.sh" openssh-server \
        || say "could not install it (not root?): run 'sudo apt-get install -y openssh-server' to use hvdtrain cluster"
fi

# --- build tools and what a GPU or MPI build of Horovod needs, checked before anything slow ---
nvcc_release() {  # CUDA_HOME: prints its nvcc's release (12.5), or nothing
    { "$1/bin/nvcc" --version 2>/dev/null || true; } | sed -n 's/.*release \([0-9.]*\),.*/\1/p'
}
build_checks() {
    # Horovod's bundled Gloo does not build with CMake 4.
    if ! command -v cmake >/dev/null 2>&1; then
        apt_install cmake g++ || die "cmake (3.x) and g++ are needed to build Horovod"
    fi
    cmake_major=$(cmake --version | awk 'NR==1 {split($3, v, "."); print v[1]}')
    [ "$cmake_major" -lt 4 ] || die "cmake $(cmake --version | head -n1) found first on PATH; Horovod $HOROVOD_VERSION needs CMake 3.x (use the system cmake)"

    # What a GPU or MPI build of Horovod needs.
    if [ "$GPU" = 1 ] && [ -n "${NVCC_HOME:-}" ]; then
        nvcc_home=$(cd "$NVCC_HOME" 2>/dev/null && pwd) || die "NVCC_HOME=$NVCC_HOME is not a folder"
        cuda_release=$(nvcc_release "$nvcc_home")
        [ -n "$cuda_release" ] || die "NVCC_HOME=$NVCC_HOME has no working bin/nvcc"
    elif [ "$GPU" = 1 ]; then
        cuda_home=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
        cuda_release=$(nvcc_release "$cuda_home")
        [ -n "$cuda_release" ] \
            || die "GPU=1 needs the CUDA toolkit: no working nvcc in $cuda_home/bin (set HOROVOD_CUDA_HOME, or NVCC_HOME: see the top of launch/install.sh)"
        [ "${cuda_release%%.*}" = 12 ] \
            || die "GPU=1 needs CUDA 12, which TensorFlow $TF_VERSION runs on: $cuda_home/bin/nvcc is CUDA $cuda_release (set HOROVOD_CUDA_HOME, or NVCC_HOME: see the top of launch/install.sh)"
        nccl_include=${HOROVOD_NCCL_INCLUDE:-${HOROVOD_NCCL_HOME:+$HOROVOD_NCCL_HOME/include}}
        nccl_include=${nccl_include:-/usr/include}
        [ -f "$nccl_include/nccl.h" ] \
            || die "GPU=1 needs NCCL's headers: no nccl.h in $nccl_include (install libnccl-dev or set HOROVOD_NCCL_HOME)"
    fi
    if [ "$MPI" = 1 ] && ! command -v mpicxx >/dev/null 2>&1; then
        apt_install openmpi-bin libopenmpi-dev || die "MPI=1 needs Open MPI (mpicxx): install openmpi-bin and libopenmpi-dev"
    fi
}
if [ "$CODE_ONLY" = 1 ]; then
    [ -x "$VENV/bin/python" ] || die "CODE_ONLY=1 needs a VENV with TensorFlow and Horovod: $VENV has no bin/python"
else
    build_checks
fi

# --- virtualenv ---
if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
fi
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"
"$PY" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' \
    || die "$VENV has Python $("$PY" -c 'import platform; print(platform.python_version())'); hvdtrain needs 3.10 to 3.12 (set PYTHON=... for a new venv)"

# --- TensorFlow ---
if [ "$GPU" = 1 ]; then
    TF_REQ="tensorflow[and-cuda]==$TF_VERSION"
    other_tf=tensorflow-cpu
else
    TF_REQ="tensorflow-cpu==$TF_VERSION"
    other_tf=tensorflow
fi
# Both distributions are the one `tensorflow` package: a VENV set up for the other flavour
# (GPU=1 after a CPU setup, or back) loses that one first, or the two would overwrite
# each other's files. Horovod is then built again: its build key names the flavour.
if [ "$CODE_ONLY" = 0 ] && "$PIP" show -q "$other_tf" >/dev/null 2>&1; then
    say "$VENV has $other_tf (the other flavour's): replacing it with $TF_REQ"
    "$PIP" uninstall -q -y "$other_tf"
fi
if [ "$CODE_ONLY" = 0 ]; then
    say "installing $TF_REQ"
    "$PIP" install -q "$TF_REQ"
fi

# --- GPU with NVCC_HOME: a CUDA toolkit folder made from TensorFlow's nvidia-* wheels ---
link_all() {  # DEST SRC_DIR...: links every entry of each SRC_DIR into DEST, later ones winning
    local dest=$1 src entry; shift
    for src in "$@"; do
        for entry in "$src"/*; do
            case ${entry##*/} in __init__.py | __pycache__) ;; *) ln -sfn "$entry" "$dest/" ;; esac
        done
    done
}
# Horovod's CMake wants one folder with bin/nvcc, include/ and lib/. nvcc finds its tools,
# headers and libraries relative to the folder it is called from (nvcc.profile's TOP), so
# bin/ holds links to NVCC_HOME's files, never a link to its folder.
cuda_from_wheels() {  # DEST: builds it from $nvcc_home and the venv's nvidia-*-cu12 wheels
    local dest=$1 wheels target runtime
    wheels=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia
    # cuda_fp16.h needs CCCL's <nv/target>, which tensorflow[and-cuda] does not bring:
    # the CCCL of the same CUDA 12 release as the runtime wheel (12.9.79: 12.9.*).
    runtime=$("$PY" -c 'from importlib.metadata import version; print(version("nvidia-cuda-runtime-cu12"))')
    "$PIP" install -q "nvidia-cuda-cccl-cu12==${runtime%.*}.*"
    for target in cuda_runtime/include cuda_runtime/lib nccl/include nccl/lib cuda_cccl/include; do
        [ -d "$wheels/$target" ] || die "NVCC_HOME: no $wheels/$target (tensorflow[and-cuda] installs it)"
    done
    target=$dest/targets/x86_64-linux
    rm -rf "$dest" && mkdir -p "$dest/bin" "$target/include" "$target/lib"
    ln -s targets/x86_64-linux/include "$dest/include"
    ln -s targets/x86_64-linux/lib "$dest/lib"
    ln -s targets/x86_64-linux/lib "$dest/lib64"
    link_all "$dest/bin" "$nvcc_home/bin"
    ln -s "$nvcc_home/nvvm" "$dest/nvvm"
    link_all "$target/include" "$wheels/cuda_runtime/include" "$wheels/cuda_cccl/include" "$wheels/nccl/include"
    # The compiler's own headers go with the compiler, not with the runtime.
    ln -sfn "$nvcc_home/include/crt" "$target/include/crt"
    ln -sfn "$nvcc_home/include/fatbinary_section.h" "$target/include/fatbinary_section.h"
    link_all "$target/lib" "$wheels/cuda_runtime/lib" "$wheels/nccl/lib"
    # The device runtime goes with the compiler where it brings one (launch/nvcc-cu12.sh):
    # nvlink refuses a libcudadevrt.a newer than itself, as the runtime wheel's may be.
    if [ -f "$nvcc_home/lib/libcudadevrt.a" ]; then
        ln -sfn "$nvcc_home/lib/libcudadevrt.a" "$target/lib/libcudadevrt.a"
    fi
    ln -sfn libcudart.so.12 "$target/lib/libcudart.so"
    ln -sfn libnccl.so.2 "$target/lib/libnccl.so"
}

# --- Horovod, compiled against that TensorFlow with our patches ---
features=(TensorFlow Gloo)
build_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1)
flavour=cpu
if [ "$MPI" = 1 ]; then
    features+=(MPI)
    build_env+=(HOROVOD_WITH_MPI=1)
else
    build_env+=("HOROVOD_WITHOUT_MPI=${HOROVOD_WITHOUT_MPI:-1}")
fi
build_env+=(HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if [ "$GPU" = 1 ]; then features+=(NCCL); fi
if [ "$GPU" = 1 ] && [ "$CODE_ONLY" = 0 ]; then
    build_env+=(HOROVOD_GPU_OPERATIONS=NCCL)
    flavour=gpu-cuda$cuda_release
    if [ -n "${NVCC_HOME:-}" ]; then
        cuda_home=$(cd "$VENV" && pwd)/cuda-from-wheels
        cuda_from_wheels "$cuda_home"
        # NCCL's wheel has no static library, so Horovod links libnccl.so.2 and, as it does
        # then, no CUDA runtime: its CUDA and NCCL calls bind at load time to TensorFlow's
        # framework library, which exports both. The rpath finds the NCCL wheel from
        # site-packages/horovod/<framework>/ all the same (\$ORIGIN is the loader's).
        build_env+=(HOROVOD_NCCL_HOME="$cuda_home" HOROVOD_NCCL_LINK=SHARED
                    LDFLAGS="-Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib ${LDFLAGS:-}")
    fi
    # Horovod picks its GPU generations from the first nvcc on PATH, so it must be this one.
    build_env+=(HOROVOD_CUDA_HOME="$cuda_home" PATH="$cuda_home/bin:$PATH")
fi
if [ "$MPI" = 1 ]; then flavour=$flavour-mpi; fi
missing_feature() {  # FEATURE...: prints the first one the installed horovodrun lacks
    local check feature
    check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null) || { echo "a working horovodrun"; return; }
    for feature in "$@"; do
        grep -q "\[X\] $feature *\$" <<< "$check" || { echo "$feature"; return; }
    done
}
# One wheel per everything that changes the binary: a wheel built for another TF, Python,
# flavour or patch set would load and then fail on a missing symbol, or lack a feature.
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
patch_sum=$(cat "$PATCH_DIR"/*.patch | sha256sum | cut -c1-12)
build_key="horovod-$HOROVOD_VERSION-tf$TF_VERSION-$py_tag-$flavour-$patch_sum"
key_file="$VENV/.horovod-build"

build_horovod_wheel() {  # builds the patched sdist into $WHEEL_CACHE/$build_key/
    local work src patch
    work=$(mktemp -d)
    command -v patch >/dev/null 2>&1 || apt_install patch || die "the 'patch' tool is needed to build Horovod"
    say "building horovod $HOROVOD_VERSION for $build_key (about 3 minutes, once)"
    "$PIP" download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for patch in "$PATCH_DIR"/*.patch; do
        patch -d "$src" -p1 --forward --batch --quiet < "$patch" >/dev/null \
            || die "patch $(basename "$patch") does not apply to horovod $HOROVOD_VERSION"
    done
    env "${build_env[@]}" "$PIP" wheel -q --no-build-isolation --no-deps -w "$work/wheel" "$src" \
        || die "building horovod $HOROVOD_VERSION failed (see the compiler output above)"
    mkdir -p "$WHEEL_CACHE"
    # Renamed into place whole, so an interrupted build never leaves half a cache entry.
    mv "$work/wheel" "$WHEEL_CACHE/$build_key.tmp$$"
    rm -rf "${WHEEL_CACHE:?}/$build_key"
    mv "$WHEEL_CACHE/$build_key.tmp$$" "$WHEEL_CACHE/$build_key"
    rm -rf "$work"
}

if [ "$CODE_ONLY" = 0 ] && { [ "$(cat "$key_file" 2>/dev/null)" != "$build_key" ] \
        || [ -n "$(missing_feature "${features[@]}")" ]; }; then
    # Horovod's runtime requirements, which its setup.py also wants at build time; the
    # wheel itself goes in with --no-deps.
    "$PIP" install -q cloudpickle psutil pyyaml packaging
    if ! ls "$WHEEL_CACHE/$build_key"/horovod-*.whl >/dev/null 2>&1; then
        build_horovod_wheel
    else
        say "horovod $HOROVOD_VERSION from the wheel cache ($build_key)"
    fi
    "$PIP" install -q --force-reinstall --no-deps "$WHEEL_CACHE/$build_key"/horovod-*.whl
    echo "$build_key" > "$key_file"
fi
missing=$(missing_feature "${features[@]}")
[ -z "$missing" ] || die "horovod was built without $missing (horovodrun --check-build)"

# --- hvdtrain itself ---
if [ "${DEPS_ONLY:-0}" = 1 ]; then
    say "DEPS_ONLY=1: not installing hvdtrain"
else
    say "installing hvdtrain (editable, with dev extras)"
    "$PIP" install -q -e ".[dev]"
    # horovodrun's own import of TensorFlow, behind hvdtrain.quiet's hook (the script says why).
    bash "$LAUNCH_DIR/quiet-horovodrun.sh" "$VENV"
fi
say "done: $("$PY" -c 'import tensorflow as tf, horovod; print("tensorflow", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null)"
