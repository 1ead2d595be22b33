#!/usr/bin/env bash
# What a host's NIC carries per step: flat local SGD's default (int8 rounds every 2 steps)
# against the hierarchy at longer periods (every 3 steps on 2 hosts of 4, every 4 on 4
# hosts of 2), AlexNet at 64x64 (a 20 MB int8 round), 8 workers on emulated hosts,
# Horovod's default cycle time. Each setup runs 36 and 12 steps; the difference over 24
# steps cancels start-up (the first broadcast, Horovod's and Gloo's set-up). Run from the
# repository's root with the venv's bin first on PATH, as root; REPS picks the repeats.
set -u
OUT=${OUT:-runs/nic-third}
HERE=$(dirname "$0")
mkdir -p "$OUT"
for rep in ${REPS:-1 2 3}; do
  for setup in "flat 2x4 2" "hier 2x4 3" "flat 4x2 2" "hier 4x2 4"; do
    set -- $setup
    kind=$1 shape=$2 n=$3 hosts=${2%x*} slots=${2#*x}
    for j in $(seq 1 "$hosts"); do echo "h$j slots=$slots"; done > "$OUT/hosts$shape"
    extra=()
    [ "$kind" = hier ] && extra=(--hierarchical-sgd)
    for steps in 36 12; do
      name=$kind-$shape-n$n-c1-s$steps-r$rep
      [ -f "$OUT/$name.json" ] && continue
      hvdtrain cluster --hosts "$hosts" --nic-counters "$OUT/$name.json" -- \
        horovodrun -np 8 -hostfile "$OUT/hosts$shape" --gloo --network-interface eth0 \
          python -m hvdtrain train --model alexnet --dataset synthetic-device \
          --synthetic-shape 64x64x3 --epochs 1 --batch-size 32 --steps-per-epoch "$steps" \
          --no-validate --mode local --round-compression int8 --n-sync "$n" --seed 1 \
          "${extra[@]}" --out "$OUT/run-$name" > "$OUT/$name.log" 2>&1
    done
  done
done
python "$HERE/ratios.py" "$OUT"
