"""A worker's start-up, in its one valid order. `hvdtrain train` and `hvdtrain bench` use it.

1. The host check (`host_capacity`), before TensorFlow is imported: the import is the
   bulk of a worker's start-up and memory, so a machine too small says so first.
2. The worker's cores: its own slice (--pin-cores), or TensorFlow's thread pools sized
   for the workers sharing them (`cpu_cores`). TensorFlow sizes its pools when its
   runtime starts and cannot change them after.
3. Horovod (`comm.init`), with the host groups if asked for. Their names travel in a
   collective call, which starts TensorFlow's runtime; so does an elastic state's sync.
4. The devices of the worker's model (`devices`), before its first op.

Steps 1 and 2 take how many workers share the machine from the environment horovodrun
gives (`MachineShare`): it is known before Horovod starts. A process starts once; a later
run in it (`hvdtrain bench`'s setups, a test's several trainings) finds its cores set and
Horovod started, and may still ask for the host groups and the same devices.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from hvdtrain.config import TrainConfig
from hvdtrain.errors import ConfigError
from hvdtrain.machine.host_capacity import check_this_host, rendezvous_timeout
from hvdtrain.machine.share import MachineShare


@dataclass(frozen=True)
class StartedWorker:
    """What a worker's start gave it."""

    share: MachineShare
    pinned: bool          # a slice of the cores of its own (--pin-cores)
    cores: float          # the cores it counts as its own (summary.json's cores_per_worker)
    devices: list[str]    # its model's devices, for the last run that started it


_started: StartedWorker | None = None


def start_worker(cfg: TrainConfig) -> StartedWorker:
    """Start this worker for a run of `cfg`, or, started already, only what `cfg` adds."""
    global _started
    if _started is None:
        _started = _first_start(cfg, MachineShare.from_environ())
    elif cfg.pin_cores != _started.pinned:
        raise ConfigError(f"--pin-cores is set when a worker starts: this process started "
                          f"{'with' if _started.pinned else 'without'} it, for an earlier run")
    else:
        _started = replace(_started, devices=_horovod_and_devices(cfg, _started.share))
    return _started


def _first_start(cfg: TrainConfig, share: MachineShare) -> StartedWorker:
    check_this_host(share)
    # The machine's cores, before this worker takes its slice: all its workers import there.
    wait = rendezvous_timeout(share.workers, len(os.sched_getaffinity(0)))
    from hvdtrain.machine.cpu_cores import claim_cores  # imports TensorFlow: after the check

    cores = claim_cores(share, cfg.pin_cores)
    return StartedWorker(share, cfg.pin_cores, cores, _horovod_and_devices(cfg, share, wait))


def _horovod_and_devices(cfg: TrainConfig, share: MachineShare,
                         rendezvous_seconds: int | None = None) -> list[str]:
    from hvdtrain import comm  # imports TensorFlow: after the check
    from hvdtrain.machine.devices import configure_devices

    # TensorFlow's own op determinism is left off: it refuses tf.timestamp, which times
    # every exchange (hvdtrain.keras.exchange_clock), and CPU kernels repeat without it.
    comm.init(fuse_tensors=not cfg.deterministic, host_groups=cfg.hierarchical_sgd,
              rendezvous_seconds=rendezvous_seconds)
    return configure_devices(cfg.model_parallel, share.index)
