"""Which devices each worker's model uses, for hybrid model and data parallelism.

With model parallelism N, every Horovod worker splits its model over N devices and
the workers are data-parallel replicas of that split model: Yadan et al.'s (2013)
"model + data" hybrid. On a machine with GPUs the worker with local rank r owns GPUs
N·r ... N·r+N−1, so workers on one machine never share a GPU. Without GPUs each
worker splits its CPU into N logical devices: the same placement code runs, which
is what the tests use (the logical devices share the CPU's cores, so expect no
speed-up from them).

`worker_gpus` and `model_parallel_devices` are pure; `configure_devices` applies the
choice to TensorFlow and must run before TensorFlow initialises its devices: right
after `hvdtrain.keras.init()`, before building a model or running any op.
"""

from __future__ import annotations

import tensorflow as tf

from hvdtrain.errors import ConfigError


def _check_count(value, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive" if minimum == 1 else "a non-negative"
        raise ConfigError(f"{what} must be {kind} integer, got {value!r}")


def _check(model_parallel, local_rank, gpus) -> None:
    _check_count(model_parallel, "--model-parallel", 1)
    _check_count(local_rank, "local rank", 0)
    _check_count(gpus, "GPU count", 0)


def worker_gpus(model_parallel: int, local_rank: int, gpus: int) -> list[int]:
    """Indices of the physical GPUs the worker with `local_rank` owns ([] without GPUs)."""
    _check(model_parallel, local_rank, gpus)
    if gpus == 0:
        return []
    first = model_parallel * local_rank
    needed = list(range(first, first + model_parallel))
    if needed[-1] >= gpus:
        wanted = f"GPU {first}" if model_parallel == 1 else f"GPUs {first}-{needed[-1]}"
        raise ConfigError(
            f"not enough GPUs: the worker with local rank {local_rank} needs {wanted} for "
            f"--model-parallel {model_parallel}, but this machine has {gpus}")
    return needed


def model_parallel_devices(model_parallel: int, local_rank: int, gpus: int) -> list[str]:
    """The device names the worker's model is placed on once `configure_devices` has run.

    TensorFlow renumbers the GPUs a process can see from 0, so a worker's GPUs are
    always GPU:0 ... GPU:N-1 whatever its local rank (which physical ones they are is
    `worker_gpus`); without GPUs they are the logical CPUs CPU:0 ... CPU:N-1.
    """
    kind = "GPU" if worker_gpus(model_parallel, local_rank, gpus) else "CPU"
    return [f"/device:{kind}:{i}" for i in range(model_parallel)]


def configure_devices(model_parallel: int, local_rank: int) -> list[str]:
    """Give this worker its devices and return their names, for the model's `devices`.

    With GPUs: only the worker's own GPUs stay visible, with memory growth (so a
    worker does not reserve memory on a GPU it will not use). Without: the CPU is
    split into `model_parallel` logical devices. Calling it again with the same
    arguments is harmless; calling it after TensorFlow has started with other
    devices is a ConfigError.
    """
    physical_gpus = tf.config.list_physical_devices("GPU")
    names = model_parallel_devices(model_parallel, local_rank, len(physical_gpus))
    try:
        if physical_gpus:
            mine = [physical_gpus[i] for i in worker_gpus(model_parallel, local_rank,
                                                          len(physical_gpus))]
            tf.config.set_visible_devices(mine, "GPU")
            for gpu in mine:
                tf.config.experimental.set_memory_growth(gpu, True)
        elif model_parallel > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(model_parallel)])
    except RuntimeError as exc:
        raise ConfigError(
            f"cannot give this worker {len(names)} devices for --model-parallel "
            f"{model_parallel}: TensorFlow has already initialised its devices "
            f"({str(exc).splitlines()[0]}); configure devices right after hvdtrain.keras.init(), "
            "before building a model or running any TensorFlow op") from None
    return names
