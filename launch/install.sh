#!/usr/bin/env bash
# Installs everything hvdtrain needs into a virtualenv; safe to run again.
#
#   bash launch/install.sh [VENV]           CPU: tensorflow-cpu
#   GPU=1 bash launch/install.sh [VENV]     GPU: tensorflow[and-cuda], Horovod with NCCL
#
# Order matters: Horovod compiles against the TensorFlow already installed, so it
# needs TF first and pip's --no-build-isolation. pip keeps the built Horovod wheel
# in its cache, so a second install (a new venv, CI) takes seconds, not minutes.
set -euo pipefail

VENV=${1:-.venv}
PYTHON=${PYTHON:-python3.11}
TF_VERSION=2.15.1
HOROVOD_VERSION=0.28.1
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
if [ "${GPU:-0}" = 1 ]; then
    TF_REQ="tensorflow[and-cuda]==$TF_VERSION"
    export HOROVOD_GPU_OPERATIONS=NCCL
else
    TF_REQ="tensorflow-cpu==$TF_VERSION"
fi
say "installing $TF_REQ"
"$PIP" install -q "$TF_REQ"

# --- Horovod, compiled against that TensorFlow ---
if ! "$PY" -c "import horovod, horovod.tensorflow; assert horovod.__version__ == '$HOROVOD_VERSION'" >/dev/null 2>&1; then
    say "building horovod $HOROVOD_VERSION (a few minutes the first time; cached afterwards)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=${HOROVOD_WITHOUT_MPI:-1} \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        "$PIP" install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
fi
check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null)
echo "$check" | grep -q '\[X\] TensorFlow' || die "horovod was built without TensorFlow: $check"
echo "$check" | grep -q '\[X\] Gloo' || die "horovod was built without Gloo: $check"

# --- hvdtrain itself ---
say "installing hvdtrain (editable, with dev extras)"
"$PIP" install -q -e ".[dev]"
say "done: $("$PY" -c 'import tensorflow as tf, horovod; print("tensorflow", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null)"
