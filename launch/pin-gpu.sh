#!/usr/bin/env bash
# Runs a command with exactly one GPU visible: the one of this worker's local rank.
#
#   horovodrun ... launch/pin-gpu.sh hvdtrain train ...
#
# horovodrun starts every worker of a host with the same command, and TensorFlow
# claims memory on every GPU it can see, so without this 8 workers on an 8-GPU host
# would each grab all 8. If CUDA_VISIBLE_DEVICES already lists the GPUs this job may
# use (Slurm, docker --gpus '"device=4,5"'), the worker gets its entry of that list.
# No local rank (a plain single process): the command runs unchanged.
# HVDTRAIN_PIN_GPU=0 turns this off, for training code that pins GPUs itself.
set -euo pipefail

local_rank=${HOROVOD_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-}}
if [ "${HVDTRAIN_PIN_GPU:-1}" != 0 ] && [ -n "$local_rank" ]; then
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
