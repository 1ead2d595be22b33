#!/usr/bin/env bash
# Runs a command with exactly one GPU visible: the one of this worker's local rank.
#
#   horovodrun -np 16 -hostfile hosts.txt --gloo launch/pin-gpu.sh python my_train.py
#
# For training scripts of your own that do not choose a GPU themselves: horovodrun
# starts every worker of a host with the same command, and TensorFlow claims memory on
# every GPU it can see, so 8 workers on an 8-GPU host would each grab all 8. If
# CUDA_VISIBLE_DEVICES already lists the GPUs this job may use (Slurm, docker --gpus
# '"device=4,5"'), the worker gets its entry of that list. Without a local rank (a
# plain single process) the command runs unchanged. Not for programs that pick their
# GPUs by local rank themselves, as hvdtrain/machine/devices.py does: they would see one GPU.
set -euo pipefail

local_rank=${HOROVOD_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-}}
if [ -n "$local_rank" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
        if [ "$local_rank" -ge "${#gpus[@]}" ]; then
            printf 'pin-gpu.sh: error: local rank %s but CUDA_VISIBLE_DEVICES=%s lists %s GPUs: more workers than GPUs on this host\n' \
                "$local_rank" "$CUDA_VISIBLE_DEVICES" "${#gpus[@]}" >&2
            exit 2
        fi
        CUDA_VISIBLE_DEVICES=${gpus[$local_rank]}
    else
        CUDA_VISIBLE_DEVICES=$local_rank
    fi
    export CUDA_VISIBLE_DEVICES
fi
exec "$@"
