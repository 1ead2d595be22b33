"""Whether one host can run the workers horovodrun started on it, said in one line
before any of them starts TensorFlow (the bulk of a worker's start-up and memory).

Measured on a machine of 2 cores and 24 GiB (BENCHMARKS.md, "Memory and start-up: 16
and 32 workers on one machine"), LeNet on Fashion-MNIST: 16 and 32 workers on one host train and end in
consensus, the job about as fast as 2 workers and its start-up 22-24 times as long, so
more workers than cores is a warning.
Each worker took 249-308 MiB of the host's available memory (TensorFlow's libraries,
another 350 MiB of every worker's resident memory, are shared), so a host that cannot
give every worker WORKER_FLOOR_BYTES would see the kernel kill one of them midway: that
is a refusal, said by every worker of that host. Workers already running hold their
memory already (the host's available memory no longer counts it): only what they lack
of the floor, and the floor of each worker still to come, is asked for.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

from hvdtrain.errors import ConfigError
from hvdtrain.machine.share import MachineShare
from hvdtrain.machine.running_workers import memory_held_by_peers

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


def top_ups(peers_held: Sequence[int], floor: int = WORKER_FLOOR_BYTES) -> int:
    """Bytes the running workers, each holding `peers_held`, still take to reach `floor`."""
    return sum(max(0, floor - held) for held in peers_held)


def memory_problem(workers: int, available: int, floor: int = WORKER_FLOOR_BYTES,
                   peers_held: Sequence[int] = ()) -> str | None:
    """Why `workers` cannot run in `available` bytes, each needing at least `floor`, when
    the others of them already running hold `peers_held` (this one is never among them:
    it has not started TensorFlow yet); or None."""
    # More than the other workers would be a stale process: count those holding least.
    peers = sorted(peers_held)[:workers - 1]
    needed = (workers - len(peers)) * floor + top_ups(peers, floor)
    if needed <= available:
        return None
    fit = max(1, len(peers) + max(0, available - top_ups(peers, floor)) // floor)
    already = f", {len(peers)} of them running already," if peers else ""
    more = " more" if peers else ""
    return (f"{workers} workers on this host{already} need at least {needed // MIB} MiB{more} "
            f"({floor // MIB} MiB each, the least a worker was measured to take) but it has "
            f"{available // MIB} MiB available: start at most {fit} here")


def cores_warning(workers: int, cores: int) -> str | None:
    """A line for more workers than cores on one host, or None."""
    if workers <= cores:
        return None
    return (f"hvdtrain: warning: {workers} workers share {cores} core(s) on this host "
            f"({workers / cores:g} a core): each gets one TensorFlow thread, the job trains "
            f"no faster than {cores} worker(s) would, and it takes {workers / cores:g}x as "
            f"long or more to start")


def check_this_host(share: MachineShare, environ: Mapping[str, str] = os.environ,
                    meminfo_path: str = "/proc/meminfo", proc: str = "/proc") -> None:
    """Refuse a machine without the memory for the workers of `share` (ConfigError, from
    every worker refused); warn, on rank 0, of more workers than cores. `environ` tells
    the job's other workers already running here (`running_workers`) from the rest."""
    if share.workers == 1:
        return
    with open(meminfo_path, encoding="ascii") as fh:
        available = mem_available(fh.read())
    problem = memory_problem(share.workers, available,
                             peers_held=memory_held_by_peers(environ, proc))
    if problem:
        raise ConfigError(problem)
    warning = cores_warning(share.workers, len(os.sched_getaffinity(0)))
    if warning and share.rank == 0:
        print(warning, flush=True)
