"""Give each worker of a machine its own CPU cores, as each would own its own GPU.

Workers that share all of a machine's cores lend each other compute: while one waits
(in a round, or sleeping as an emulated slower GPU) the other's TensorFlow threads
take its cores and run faster than they would on a device of their own. Pinned, a
worker computes at the same pace whatever the others do, which is what a benchmark of
unequal or waiting workers has to emulate. MPI launchers do this with `--bind-to
core`; horovodrun's Gloo launcher has no such option, so the worker does it itself.

`worker_cores` is pure; `pin_worker` applies it and must run before TensorFlow
starts its runtime (its thread pools are sized from the cores a process may use).
"""

from __future__ import annotations

import os

import tensorflow as tf

from hvdtrain.errors import ConfigError


def worker_cores(allowed: list[int], local_rank: int, local_size: int) -> list[int]:
    """The cores of `allowed` for the worker with `local_rank` among `local_size` on the
    machine: equal consecutive slices, any remainder left unused so that no worker has
    more than another."""
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is not among {local_size} workers")
    cores = sorted(allowed)
    share = len(cores) // local_size
    if share == 0:
        raise ConfigError(f"--pin-cores: {local_size} workers on this machine but only "
                          f"{len(cores)} core(s) to give them ({cores})")
    return cores[local_rank * share:(local_rank + 1) * share]


def pin_worker(local_rank: int, local_size: int) -> list[int]:
    """Keep every thread of this process (Horovod's included) on this worker's cores and
    size TensorFlow's thread pools to them; returns the cores."""
    cores = worker_cores(sorted(os.sched_getaffinity(0)), local_rank, local_size)
    try:  # first: it fails, changing nothing, once TensorFlow has started
        tf.config.threading.set_intra_op_parallelism_threads(len(cores))
        # At least two: a round in the background runs beside the training step.
        tf.config.threading.set_inter_op_parallelism_threads(max(2, len(cores)))
    except RuntimeError as exc:
        raise ConfigError("--pin-cores must take effect before TensorFlow starts its runtime "
                          f"({str(exc).splitlines()[0]})") from None
    # Threads that exist already (Horovod's background loop, Gloo's) keep their own
    # affinity; threads made later inherit the one of the thread that makes them.
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), cores)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
    return cores
