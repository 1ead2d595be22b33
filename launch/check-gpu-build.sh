#!/usr/bin/env bash
# Proves that the GPU build compiles, on a machine without a GPU: `make check-gpu-build`.
#
#   bash launch/check-gpu-build.sh [VENV]      default .venv-gpu, made afresh
#
# Runs GPU=1 launch/install.sh (tensorflow[and-cuda], Horovod with NCCL; gigabytes of
# downloads, then a compile) into a new VENV with an empty wheel cache, so Horovod is
# really compiled, then checks what needs no GPU driver: Horovod's TensorFlow library
# links NCCL and the CUDA runtime, and `horovodrun --check-build` lists NCCL.
#
# With a CUDA 12 toolkit (HOROVOD_CUDA_HOME, or /usr/local/cuda) install.sh uses it.
# Without one, this brings CUDA 13's nvcc from PyPI (the only nvcc there: see "GPU" at
# the top of launch/install.sh) and passes it as NVCC_HOME. HOROVOD_BUILD_CUDA_CC_LIST
# sets the GPU generations (default: those of docker/Dockerfile.gpu that nvcc knows).
set -euo pipefail

VENV=${1:-.venv-gpu}
PYTHON=${PYTHON:-python3}
NVCC_PYPI_VERSION=${NVCC_PYPI_VERSION:-13.0.88}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf 'check-gpu-build: %s\n' "$*"; }
die() { printf 'check-gpu-build: error: %s\n' "$*" >&2; exit 1; }
nvcc_release() { { "$1/bin/nvcc" --version 2>/dev/null || true; } | sed -n 's/.*release \([0-9.]*\),.*/\1/p'; }

cuda_home=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
release=$(nvcc_release "$cuda_home")
say "fresh $VENV"
rm -rf -- "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel

if [ -z "${NVCC_HOME:-}" ] && [ "${release%%.*}" != 12 ]; then
    say "no CUDA 12 nvcc (${cuda_home}: ${release:-none}): CUDA $NVCC_PYPI_VERSION's nvcc from PyPI"
    "$VENV/bin/pip" install -q --no-deps --target "$VENV/nvcc" "nvidia-cuda-nvcc==$NVCC_PYPI_VERSION" \
        "nvidia-cuda-crt==$NVCC_PYPI_VERSION" "nvidia-nvvm==$NVCC_PYPI_VERSION"
    NVCC_HOME=$(cd "$VENV/nvcc/nvidia/cu${NVCC_PYPI_VERSION%%.*}" && pwd)
    export NVCC_HOME
    release=$(nvcc_release "$NVCC_HOME")
fi
if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
    # CUDA 13 builds no code for V100 (7.0).
    HOROVOD_BUILD_CUDA_CC_LIST=$(sed -n 's/^ARG CUDA_CC_LIST=//p' "$ROOT/docker/Dockerfile.gpu")
    [ "${release%%.*}" = 12 ] || HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST#70,}
    export HOROVOD_BUILD_CUDA_CC_LIST
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheels=$work/wheels
say "GPU=1 launch/install.sh $VENV (nvcc $release, GPU generations $HOROVOD_BUILD_CUDA_CC_LIST)"
(cd "$ROOT" && GPU=1 DEPS_ONLY=1 HVDTRAIN_WHEEL_CACHE="$wheels" bash launch/install.sh "$VENV")

# --- what can be checked without a driver ---
lib=$(ls "$VENV"/lib/python3*/site-packages/horovod/tensorflow/mpi_lib*.so)
site=$(cd "$(dirname "$lib")/../.." && pwd)
needed=$(readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
say "$(basename "$lib") needs: $(tr '\n' ' ' <<< "$needed")"
if grep -q '^libnccl\.so' <<< "$needed"; then
    nccl=$(ldd "$lib" | grep 'libnccl\.so' | sed 's/^[[:space:]]*//')
    [[ $nccl != *"not found"* ]] || die "NCCL is linked but not found: $nccl"
    say "NCCL: linked dynamically: $nccl"
fi
# Horovod leaves its CUDA runtime and NCCL calls undefined unless it links NCCL statically.
# The loader binds each to the first library that defines it: TensorFlow's, loaded first
# and globally (its stubs load the nvidia-* wheels' libcudart and libnccl), then the
# libraries Horovod's own needs, in order. Every such call must find one.
defined() {  # NAME PATH: NAME's exported symbols, one "symbol NAME" a line
    nm -D --defined-only "$2" | awk -v lib="$1" '{sub(/@.*/, "", $NF); print $NF, lib}'
}
{
    for name in $needed; do
        [ ! -e "$site/tensorflow/$name" ] || defined "$name" "$site/tensorflow/$name"
    done
    for name in $needed; do
        path=$(ldd "$lib" | awk -v name="$name" '$1 == name && $3 ~ /^\// {print $3}')
        [ -z "$path" ] || defined "$name" "$path"
    done
} > "$work/defined"
nm -D --undefined-only "$lib" | awk '{sub(/@.*/, "", $NF); print $NF}' | grep -E '^(__)?(cuda|nccl)' \
    | sort -u > "$work/calls"
[ -s "$work/calls" ] || nm "$lib" | grep -q ' T cudaStreamCreate' \
    || die "$(basename "$lib") makes no CUDA runtime or NCCL call: not a GPU build"
while read -r symbol; do
    supplier=$(awk -v s="$symbol" '$1 == s {print $2; exit}' "$work/defined")
    [ -n "$supplier" ] || die "$(basename "$lib") calls $symbol, which none of its libraries defines"
    echo "${symbol%%[A-Z]*} $supplier"
done < "$work/calls" | sort | uniq -c | while read -r count kind supplier; do
    say "$count $kind* calls bound to $supplier"
done
check=$("$VENV/bin/horovodrun" --check-build)
printf '%s\n' "$check"
grep -q '\[X\] NCCL *$' <<< "$check" || die "horovodrun --check-build does not list NCCL"
say "ok: Horovod built with NCCL against TensorFlow $("$VENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) in ${SECONDS}s"
