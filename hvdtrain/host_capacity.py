"""Whether one host can run the workers horovodrun started on it, said in one line
before any of them starts TensorFlow (the bulk of a worker's start-up and memory).

Measured on a machine of 2 cores and 24 GiB (BENCHMARKS.md, "16 and 32 workers on one
machine"), LeNet on Fashion-MNIST: 16 and 32 workers on one host train and end in
consensus, the job about as fast as 2 workers and its start-up 22-24 times as long, so
more workers than cores is a warning.
Each worker took 249-308 MiB of the host's available memory (TensorFlow's libraries,
another 350 MiB of every worker's resident memory, are shared), so a host that cannot
give every worker WORKER_FLOOR_BYTES would see the kernel kill one of them midway: that
is a refusal, by every worker of that host, named once by its first.
"""

from __future__ import annotations

import math
import os

from hvdtrain.errors import ConfigError
from hvdtrain.machine_share import MachineShare

MIB = 1 << 20
# The least a worker takes of its host's available memory: the smallest measured, a LeNet
# worker of 8 on one host (249 MiB, BENCHMARKS.md), rounded down. Larger models and
# data take more.
WORKER_FLOOR_BYTES = 240 * MIB


# Horovod's own wait at its start for every worker to reach it (Gloo's rendezvous), in
# seconds, and a worker's CPU seconds from its start to there (TensorFlow's and Keras's
# imports, 3.7 s measured): workers that share cores arrive spread over their imports.
GLOO_DEFAULT_TIMEOUT = 30
IMPORT_CPU_SECONDS = 4


def rendezvous_timeout(workers: int, cores: int) -> int | None:
    """Seconds Gloo's rendezvous should wait for the last of `workers` sharing `cores`, or
    None where Horovod's own 30 cover it. 32 workers on 2 cores took a minute to import
    side by side and reached the rendezvous up to 25 s apart (BENCHMARKS.md); one of five
    such jobs died of the 30 s wait. Twice the whole import time leaves room for a
    host busy with other work."""
    seconds = 2 * math.ceil(IMPORT_CPU_SECONDS * workers / cores)
    return seconds if seconds > GLOO_DEFAULT_TIMEOUT else None


def mem_available(meminfo: str) -> int:
    """MemAvailable of /proc/meminfo's text, in bytes: what can be given to new processes
    without swapping (the page cache that can be dropped included)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("/proc/meminfo has no MemAvailable line")


def memory_problem(workers: int, available: int, floor: int = WORKER_FLOOR_BYTES) -> str | None:
    """Why `workers` cannot run in `available` bytes, each needing at least `floor`; or None."""
    if workers * floor <= available:
        return None
    return (f"{workers} workers on this host need at least {workers * floor // MIB} MiB "
            f"({floor // MIB} MiB each, the least a worker was measured to take) but it has "
            f"{available // MIB} MiB available: start at most {max(1, available // floor)} here")


def cores_warning(workers: int, cores: int) -> str | None:
    """A line for more workers than cores on one host, or None."""
    if workers <= cores:
        return None
    return (f"hvdtrain: warning: {workers} workers share {cores} core(s) on this host "
            f"({workers / cores:g} a core): each gets one TensorFlow thread, the job trains "
            f"no faster than {cores} worker(s) would, and it takes {workers / cores:g}x as "
            f"long or more to start")


def check_this_host(share: MachineShare, meminfo_path: str = "/proc/meminfo") -> None:
    """Refuse a machine without the memory for the workers of `share` (ConfigError from its
    first worker, a quiet exit with the same status from the others, which horovodrun would
    end anyway); warn, on rank 0, of more workers than cores."""
    if share.workers == 1:
        return
    with open(meminfo_path, encoding="ascii") as fh:
        problem = memory_problem(share.workers, mem_available(fh.read()))
    if problem:
        if share.index == 0:
            raise ConfigError(problem)
        raise SystemExit(ConfigError.exit_code)
    warning = cores_warning(share.workers, len(os.sched_getaffinity(0)))
    if warning and share.rank == 0:
        print(warning, flush=True)
