#!/usr/bin/env bash
# Builds hvdtrain's CPU image (docker/Dockerfile.cpu), or with GPU=1 its GPU image
# (docker/Dockerfile.gpu), with podman or docker, whichever runs here; `make image` calls it. The build ends with the Dockerfile's own checks
# (horovodrun --check-build and the one- and two-worker smoke tests) inside the image.
#
#   bash launch/image.sh                     IMAGE=hvdtrain:cpu from the Dockerfile's PYTHON_IMAGE,
#                                            pulled first; where no image registry answers,
#                                            from a base made as BASE=debootstrap makes it
#   BASE=debootstrap bash launch/image.sh    the Python base made from Debian's packages
#                                            with mmdebstrap: for machines that reach a
#                                            package mirror but no image registry
#   GPU=1 bash launch/image.sh               IMAGE=hvdtrain:gpu, from NVIDIA's CUDA images,
#                                            or with BASE=debootstrap both of its stages
#                                            on that Debian base (Python 3.11)
#   CA_BUNDLE=FILE bash launch/image.sh      pip trusts FILE during the build steps only
#                                            (default: the machine's own bundle; CA_BUNDLE=
#                                            passes none). It is a build secret: it is
#                                            never written to a layer of the image.
#   ENGINE=podman|docker, IMAGE=NAME:TAG, DEBIAN_MIRROR=URL (for BASE=debootstrap)
#   bash launch/image.sh engine              only make sure an engine (and for
#                                            BASE=debootstrap, mmdebstrap) is there
#
# As root on Debian or Ubuntu, podman (and mmdebstrap for BASE=debootstrap) is installed
# when neither engine runs, as `make setup` installs sshd. A second build with no
# change takes seconds: every layer comes from the engine's cache.
set -euo pipefail

GPU=${GPU:-0}
case "$GPU" in
    1) FLAVOUR=gpu ;;
    0 | "") FLAVOUR=cpu ;;
    *) printf 'image: error: GPU must be 1 or 0, got %s\n' "$GPU" >&2; exit 2 ;;
esac
IMAGE=${IMAGE:-hvdtrain:$FLAVOUR}
BASE=${BASE:-}
DEBIAN_BASE=localhost/hvdtrain-base:bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOCKERFILE=$ROOT/docker/Dockerfile.$FLAVOUR
# The base tarball mmdebstrap writes, removed on any exit: global, since the EXIT trap
# runs after make_base's locals are gone.
BASE_TAR=
# What podman and docker say when no image registry answers a pull.
REGISTRY_DOWN='pinging container registry|dial tcp|no such host|connection refused|i/o timeout'
REGISTRY_DOWN+='|network is unreachable|Temporary failure in name resolution|TLS handshake timeout'
REGISTRY_PROBLEM=  # what pull_base_images found, for the line that says so

say() { printf 'image: %s\n' "$*"; }
die() { printf 'image: error: %s\n' "$*" >&2; exit 2; }

runs() { command -v "$1" >/dev/null 2>&1 && "$1" info >/dev/null 2>&1; }

apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

pick_engine() {
    if [ -n "${ENGINE:-}" ]; then
        runs "$ENGINE" || die "ENGINE=$ENGINE does not run here ('$ENGINE info' fails)"
        return
    fi
    # docker's client without a daemon is common (CI images): ask each engine to run.
    for candidate in podman docker; do
        if runs "$candidate"; then ENGINE=$candidate; return; fi
    done
    say "neither podman nor docker runs here; installing podman"
    # runc as well: crun, which podman may bring alone, refuses hybrid cgroup hierarchies.
    apt_install podman runc \
        || die "neither podman nor docker runs here: install one (as root on Debian or Ubuntu: apt-get install podman)"
    runs podman || die "podman was installed but 'podman info' fails"
    ENGINE=podman
}

# A limit for the build's containers: WANT, or this shell's hard limit if lower. Podman's
# defaults (1048576 files) may exceed the machine's hard limits, and then no RUN starts.
capped() {
    local hard=$1 want=$2
    if [ "$hard" = unlimited ] || [ "$hard" -gt "$want" ]; then echo "$want"; else echo "$hard"; fi
}

# Podman as root without systemd (CI machines, containers): cgroupfs, and runc where
# crun refuses hybrid cgroup hierarchies.
engine_flags() {
    ENGINE_FLAGS=()
    BUILD_FLAGS=(--network host)
    if [ "$ENGINE" = podman ]; then
        ENGINE_FLAGS=(--cgroup-manager cgroupfs)
        if command -v runc >/dev/null 2>&1; then ENGINE_FLAGS+=(--runtime runc); fi
        local files procs
        files=$(capped "$(ulimit -Hn)" 16384)
        procs=$(capped "$(ulimit -Hu)" 4096)
        # --format docker: the OCI format drops SHELL, and with it the RUNs' pipefail.
        BUILD_FLAGS+=(--format docker --ulimit "nofile=$files:$files" --ulimit "nproc=$procs:$procs")
    else
        export DOCKER_BUILDKIT=1  # RUN --mount=type=secret
    fi
}

engine() { "$ENGINE" "${ENGINE_FLAGS[@]}" "$@"; }

# A Debian bookworm root with Python, imported as an image: the same Python (3.11) and
# cmake 3.25 the Dockerfile expects from python:3.12-slim-bookworm's Debian layer.
make_base() {
    if engine image inspect "$DEBIAN_BASE" >/dev/null 2>&1; then
        say "base $DEBIAN_BASE already made"
        return
    fi
    need_mmdebstrap
    BASE_TAR=$(mktemp --suffix=.tar)
    trap 'rm -f "$BASE_TAR"' EXIT
    say "making $DEBIAN_BASE from Debian bookworm ($DEBIAN_MIRROR) with mmdebstrap"
    mmdebstrap --quiet --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$BASE_TAR" "$DEBIAN_MIRROR" \
        || die "mmdebstrap could not make the Debian bookworm base from $DEBIAN_MIRROR (its messages above; DEBIAN_MIRROR=URL picks another mirror)"
    engine import --change 'CMD ["/bin/bash"]' "$BASE_TAR" "$DEBIAN_BASE" >/dev/null
    rm -f "$BASE_TAR"
    trap - EXIT
}

need_mmdebstrap() {  # [WHY]: dies, WHY first, where mmdebstrap is missing and cannot be installed
    command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap \
        || die "${1:-}BASE=debootstrap needs mmdebstrap (as root on Debian or Ubuntu: apt-get install mmdebstrap)"
}

# The Dockerfile's own bases (its ARG ..._IMAGE defaults: python:3.12-slim-bookworm; the
# GPU image's two CUDA images), pulled before the build: where no registry answers, the
# build's pull would fail deep inside it, in six lines of podman's. Returns 1 for that
# case, where BASE=debootstrap needs no registry; dies, in one line, for any other failed pull.
pull_base_images() {
    local image output
    while read -r image; do
        if engine image inspect "$image" >/dev/null 2>&1; then continue; fi
        say "pulling $image"
        if output=$(engine pull "$image" 2>&1); then continue; fi
        if grep -Eq "$REGISTRY_DOWN" <<< "$output"; then
            REGISTRY_PROBLEM="no image registry answers (pulling $image: $(first_error "$output"))"
            return 1
        fi
        die "cannot pull $image: $(first_error "$output")"
    done < <(sed -n 's/^ARG [A-Z]*_IMAGE=//p' "$DOCKERFILE")
}

# The build arguments that put the Dockerfile on the Debian base: the GPU image's two
# stages both, with Debian's Python (3.11) and the mirror its nvcc comes from.
debian_base_args() {
    if [ "$FLAVOUR" = gpu ]; then
        echo "BASE_IMAGE=$DEBIAN_BASE RUNTIME_IMAGE=$DEBIAN_BASE PYTHON_VERSION=3.11 DEBIAN_MIRROR=$DEBIAN_MIRROR"
    else
        echo "PYTHON_IMAGE=$DEBIAN_BASE"
    fi
}

first_error() {  # OUTPUT: its first line that says Error, else its last line
    grep -m1 'Error' <<< "$1" || tail -n1 <<< "$1"
}

main() {
    pick_engine
    if [ "${1:-}" = engine ]; then
        if [ "$BASE" = debootstrap ]; then need_mmdebstrap; fi
        say "$ENGINE runs here"
        return
    fi
    engine_flags
    local args=(-f "$DOCKERFILE" -t "$IMAGE") arg
    if [ -n "$CA_BUNDLE" ]; then
        [ -r "$CA_BUNDLE" ] || die "CA_BUNDLE=$CA_BUNDLE cannot be read"
        args+=(--secret "id=ca-bundle,src=$CA_BUNDLE")
    fi
    case "$BASE" in
        debootstrap) ;;
        "")
            if ! pull_base_images; then
                need_mmdebstrap "$REGISTRY_PROBLEM, and "
                say "$REGISTRY_PROBLEM; making the base from Debian's packages instead (BASE=debootstrap)"
                BASE=debootstrap
            fi
            ;;
        *) die "BASE must be debootstrap or unset, got '$BASE'" ;;
    esac
    if [ "$BASE" = debootstrap ]; then
        make_base
        for arg in $(debian_base_args); do args+=(--build-arg "$arg"); done
    fi
    say "building $IMAGE with $ENGINE (the first build takes minutes: Horovod compiles)"
    local start=$SECONDS
    engine build "${BUILD_FLAGS[@]}" "${args[@]}" "$ROOT"
    say "built $IMAGE in $((SECONDS - start)) s"
}

main "$@"
