"""Give each worker of a machine its own CPU cores, as each would own its own GPU.

Workers that share all of a machine's cores lend each other compute: while one waits
(in a round, or sleeping as an emulated slower GPU) the other's TensorFlow threads
take its cores and run faster than they would on a device of their own. Pinned, a
worker computes at the same pace whatever the others do, which is what a benchmark of
unequal or waiting workers has to emulate. MPI launchers do this with `--bind-to
core`; horovodrun's Gloo launcher has no such option, so the worker does it itself.

Unpinned workers keep TensorFlow's pools (a thread per core each) while they are no
more than the cores, so that they can lend each other idle cores; more workers than
cores get one compute thread each (`shared_pool_sizes`), since some worker always waits
for a core and more threads would only take turns on it.

`worker_cores` and `shared_pool_sizes` are pure; `pin_worker` and `size_shared_pools`
apply them (`claim_cores` for a worker's MachineShare) and must run before TensorFlow
starts its runtime (its thread pools are sized from the cores a process may use), which
Horovod's first collective call does: so before `comm.init` (`training.start`).
"""

from __future__ import annotations

import os

import tensorflow as tf

from hvdtrain.errors import ConfigError
from hvdtrain.machine.share import MachineShare


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


def shared_pool_sizes(cores: int, local_size: int) -> tuple[int, int] | None:
    """TensorFlow's (intra-op, inter-op) pool sizes for each of `local_size` unpinned
    workers sharing `cores`, or None to keep TensorFlow's own (a thread per core each)."""
    if local_size <= cores:
        return None
    return 1, pool_sizes(1)[1]


def pool_sizes(cores: int) -> tuple[int, int]:
    """(intra-op, inter-op) threads for a worker of `cores` cores: one compute thread a
    core, and at least two to run ops side by side, since a round in the background runs
    beside the training step."""
    return cores, max(2, cores)


def size_shared_pools(local_size: int) -> tuple[int, int] | None:
    """Size this unpinned worker's TensorFlow pools by `shared_pool_sizes`; returns the
    sizes set, or None where TensorFlow's own stay."""
    sizes = shared_pool_sizes(len(os.sched_getaffinity(0)), local_size)
    if sizes is not None:
        _set_pools(*sizes, option="the thread pools of workers that share cores")
    return sizes


def _set_pools(intra: int, inter: int, option: str) -> None:
    try:  # it fails, changing nothing, once TensorFlow has started
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as exc:
        raise ConfigError(f"{option} must take effect before TensorFlow starts its runtime "
                          f"({str(exc).splitlines()[0]})") from None


def pin_worker(local_rank: int, local_size: int) -> list[int]:
    """Keep every thread of this process (Horovod's included) on this worker's cores and
    size TensorFlow's thread pools to them; returns the cores."""
    cores = worker_cores(sorted(os.sched_getaffinity(0)), local_rank, local_size)
    _set_pools(*pool_sizes(len(cores)), option="--pin-cores")  # first: a refusal changes nothing
    # Threads that exist already (Horovod's background loop, Gloo's) keep their own
    # affinity; threads made later inherit the one of the thread that makes them.
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), cores)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
    return cores


def claim_cores(share: MachineShare, pin: bool) -> float:
    """This worker's part of the cores of the machine it shares with `share.workers`: a
    slice of its own with `pin`, else TensorFlow's pools sized for the workers sharing
    them all. Returns the cores it counts as its own (0.062 for one of 32 on 2 cores)."""
    if pin:
        return len(pin_worker(share.index, share.workers))
    size_shared_pools(share.workers)
    return round(len(os.sched_getaffinity(0)) / share.workers, 3)
