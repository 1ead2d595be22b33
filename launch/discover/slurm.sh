#!/usr/bin/env bash
# Horovod elastic host discovery inside a Slurm allocation (sbatch or salloc): prints one
# 'node:slots' line for every node of the allocation that slurmctld reports usable
# (allocated, mixed or idle; not down, drained or not responding) and whose sshd answers.
#
#   horovodrun -np 4 --min-np 2 --host-discovery-script launch/discover/slurm.sh --gloo \
#       hvdtrain train --elastic ...
#
# Slots: SLURM_NTASKS_PER_NODE (sbatch --ntasks-per-node); else, for a job that asked GPUs
# but no task count, SLURM_GPUS_PER_NODE, or SLURM_GPUS_ON_NODE (--gres=gpu:N, --gpus=N);
# else SLURM_TASKS_PER_NODE.
# HVDTRAIN_HOST_CHECK (tcp, ssh or none; default tcp) and HVDTRAIN_SSH_PORT (default 22)
# choose the reachability check; a node that fails it is left out, not an error.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec python3 "$here/../hostfile.py" slurm --responding --format discovery --answering \
    --check "${HVDTRAIN_HOST_CHECK:-tcp}" --port "${HVDTRAIN_SSH_PORT:-22}" --timeout 2
