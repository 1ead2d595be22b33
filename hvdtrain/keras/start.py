"""`hk.init()`: start Horovod and give this worker its own GPU, as `hvdtrain train` does.

horovodrun starts every worker of a host with the same command, and TensorFlow claims
memory on every GPU it can see: unpinned, the 8 workers of an 8-GPU host would each
reserve all 8. Horovod's own docs make this step 2 of every script; here `init` does it.
"""

from __future__ import annotations

from hvdtrain import comm
from hvdtrain.machine.devices import configure_devices


def init(pin_gpu: bool = True, **horovod) -> None:
    """Start Horovod (`horovod`: `comm.init`'s arguments, `host_groups`, `fuse_tensors`)
    and, with `pin_gpu`, leave only the GPU of this worker's local rank visible to
    TensorFlow, with memory growth (nothing changes on a machine without GPUs).

    Call it first, before building a model or running any TensorFlow op: afterwards
    TensorFlow's devices are fixed, and pinning says so in one line (ConfigError).
    `pin_gpu=False` for scripts that choose their devices themselves, or that run under
    `launch/pin-gpu.sh`, which already leaves each worker one GPU.
    """
    comm.init(**horovod)
    if pin_gpu:
        configure_devices(1, comm.local_rank())
