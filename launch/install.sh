#!/usr/bin/env bash
# Installs everything hvdtrain needs into a virtualenv; safe to run again. `make setup`,
# CI and both Docker images (docker/Dockerfile.cpu, docker/Dockerfile.gpu) run this.
#
#   bash launch/install.sh [VENV]           CPU: tensorflow-cpu, Horovod with Gloo
#   GPU=1 bash launch/install.sh [VENV]     GPU: tensorflow[and-cuda], Horovod with NCCL for
#                                           GPU tensors (needs the CUDA toolkit and NCCL headers)
#   MPI=1 ...                               also Horovod's MPI controller (needs Open MPI's mpicxx)
#   DEPS_ONLY=1 ...                         TensorFlow and Horovod only, not hvdtrain itself
#                                           (a Docker layer that survives code changes)
#
# TF_VERSION and HOROVOD_VERSION override the pinned versions below (the Dockerfiles
# pass theirs as build ARGs). Horovod's own build variables (HOROVOD_CUDA_HOME,
# HOROVOD_NCCL_HOME, HOROVOD_BUILD_CUDA_CC_LIST, ...) pass through to its build.
#
# Order matters: Horovod compiles against the TensorFlow already installed, so it
# needs TF first and pip's --no-build-isolation. pip keeps the built Horovod wheel
# in its cache, so a second install (a new venv, CI) takes seconds, not minutes.
set -euo pipefail

VENV=${1:-.venv}
PYTHON=${PYTHON:-python3.11}
TF_VERSION=${TF_VERSION:-2.15.1}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
GPU=${GPU:-0}
MPI=${MPI:-0}
DATA_DIR=/usr/share/datasets/fashion-mnist

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

# --- build tools: Horovod's bundled Gloo does not build with CMake 4 ---
if ! command -v cmake >/dev/null 2>&1; then
    apt_install cmake g++ || die "cmake (3.x) and g++ are needed to build Horovod"
fi
cmake_major=$(cmake --version | awk 'NR==1 {split($3, v, "."); print v[1]}')
[ "$cmake_major" -lt 4 ] || die "cmake $(cmake --version | head -n1) found first on PATH; Horovod $HOROVOD_VERSION needs CMake 3.x (use the system cmake)"

# --- what a GPU or MPI build of Horovod needs, checked before anything slow ---
if [ "$GPU" = 1 ]; then
    cuda_home=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
    [ -x "$cuda_home/bin/nvcc" ] \
        || die "GPU=1 needs the CUDA toolkit: no nvcc in $cuda_home/bin (set HOROVOD_CUDA_HOME)"
    nccl_include=${HOROVOD_NCCL_INCLUDE:-${HOROVOD_NCCL_HOME:+$HOROVOD_NCCL_HOME/include}}
    nccl_include=${nccl_include:-/usr/include}
    [ -f "$nccl_include/nccl.h" ] \
        || die "GPU=1 needs NCCL's headers: no nccl.h in $nccl_include (install libnccl-dev or set HOROVOD_NCCL_HOME)"
fi
if [ "$MPI" = 1 ] && ! command -v mpicxx >/dev/null 2>&1; then
    apt_install openmpi-bin libopenmpi-dev || die "MPI=1 needs Open MPI (mpicxx): install openmpi-bin and libopenmpi-dev"
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

# --- TensorFlow ---
if [ "$GPU" = 1 ]; then
    TF_REQ="tensorflow[and-cuda]==$TF_VERSION"
else
    TF_REQ="tensorflow-cpu==$TF_VERSION"
fi
say "installing $TF_REQ"
"$PIP" install -q "$TF_REQ"

# --- Horovod, compiled against that TensorFlow ---
features=(TensorFlow Gloo)
build_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1)
if [ "$MPI" = 1 ]; then
    features+=(MPI)
    build_env+=(HOROVOD_WITH_MPI=1)
else
    build_env+=("HOROVOD_WITHOUT_MPI=${HOROVOD_WITHOUT_MPI:-1}")
fi
build_env+=(HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if [ "$GPU" = 1 ]; then
    features+=(NCCL)
    build_env+=(HOROVOD_GPU_OPERATIONS=NCCL)
fi
# pip's wheel cache knows a version, not its build options: a GPU or MPI build must not
# be handed the Gloo-only CPU wheel cached by an earlier install.
cache_opts=()
if [ "$GPU" = 1 ] || [ "$MPI" = 1 ]; then cache_opts=(--no-cache-dir); fi
built_with() {  # FEATURE...: the installed horovodrun --check-build ticks every one
    local check feature
    check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null) || return 1
    for feature in "$@"; do grep -q "\[X\] $feature *\$" <<< "$check" || return 1; done
}
if ! "$PY" -c "import horovod, horovod.tensorflow; assert horovod.__version__ == '$HOROVOD_VERSION'" >/dev/null 2>&1; then
    say "building horovod $HOROVOD_VERSION (a few minutes the first time; cached afterwards)"
    env "${build_env[@]}" "$PIP" install -q --no-build-isolation "${cache_opts[@]}" "horovod==$HOROVOD_VERSION"
fi
if ! built_with "${features[@]}"; then
    # An existing install of the right version, built without something asked for now.
    say "rebuilding horovod $HOROVOD_VERSION with ${features[*]}"
    env "${build_env[@]}" "$PIP" install -q --no-build-isolation --no-cache-dir \
        --force-reinstall --no-deps "horovod==$HOROVOD_VERSION"
fi
check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null)
for feature in "${features[@]}"; do
    echo "$check" | grep -q "\[X\] $feature *\$" || die "horovod was built without $feature: $check"
done

# --- hvdtrain itself ---
if [ "${DEPS_ONLY:-0}" = 1 ]; then
    say "DEPS_ONLY=1: not installing hvdtrain"
else
    say "installing hvdtrain (editable, with dev extras)"
    "$PIP" install -q -e ".[dev]"
fi
say "done: $("$PY" -c 'import tensorflow as tf, horovod; print("tensorflow", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null)"
