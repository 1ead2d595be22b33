#!/usr/bin/env bash
# What idle Horovod process sets cost on each emulated host's NIC, per coordination
# cycle: every worker starts Horovod with no sets, the hierarchy's host sets, or its host
# and peer sets, idles 5 s or 25 s, then ends; or it runs 400 alltoalls on the global set
# whose splits are zero but to its peers. Run from the repository's root with the venv's
# bin first on PATH, as root. CACHE=0 turns Horovod's response cache off.
# Each run: NIC counters (cluster) and Horovod's timeline with its cycles marked (rank 0).
set -u
export HVDTRAIN_HOSTS_SHARE_ONE_MACHINE=1 HOROVOD_GLOO_TIMEOUT_SECONDS=300
OUT=${OUT:-runs/nic-coordination}
HERE=$(dirname "$0")
mkdir -p "$OUT"
one() { # name hosts slots variant idle alltoalls
  local name=$1 hosts=$2 slots=$3
  for j in $(seq 1 "$hosts"); do echo "h$j slots=$slots"; done > "$OUT/$name.hosts"
  hvdtrain cluster --hosts "$hosts" --nic-counters "$OUT/$name.nic.json" -- \
    horovodrun -np $((hosts * slots)) -hostfile "$OUT/$name.hosts" --gloo \
      --network-interface eth0 --start-timeout 120 --cycle-time-ms 1 \
      ${CACHE:+--cache-capacity "$CACHE"} --timeline-filename "$OUT/$name.tl.json" \
      --timeline-mark-cycles python "$HERE/idle_sets.py" "$4" "$5" "$6" > "$OUT/$name.log" 2>&1
}
for shape in 4x2 2x4; do
  h=${shape%x*} s=${shape#*x}
  for v in none host hostpeer; do
    one "$v-$shape-i5" "$h" "$s" "$v" 5 0
    one "$v-$shape-i25" "$h" "$s" "$v" 25 0
  done
  one "a2a-$shape-k0" "$h" "$s" a2a 5 0
  one "a2a-$shape-k400" "$h" "$s" a2a 5 400
done
python "$HERE/per_cycle.py" "$OUT"
