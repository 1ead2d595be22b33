#!/usr/bin/env bash
# N hvdtrain workers on this machine; one entry for every worker count.
#
#   launch/local.sh N [hvdtrain train options...]
#   launch/local.sh N [horovodrun options...] -- [hvdtrain train options...]
#   HOROVODRUN_ARGS="--autotune" launch/local.sh N [...]
#
# runs: horovodrun -np N -H localhost:N --gloo [horovodrun options] \
#           hvdtrain train [hvdtrain train options]
# e.g.  launch/local.sh 4 --fusion-threshold-mb 32 --timeline-filename tl.json -- --epochs 2
set -euo pipefail

PROG=local.sh
launch_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/common.sh
source "$launch_dir/common.sh"

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 2
fi
workers=$1
shift
require_positive_int "$workers" "N (the number of workers)"
use_venv "$(dirname "$launch_dir")"
split_args "$@"

exec horovodrun -np "$workers" -H "localhost:$workers" --gloo "${HVD_ARGS[@]}" \
    hvdtrain train "${TRAIN_ARGS[@]}"
