"""How many workers share this machine's cores and memory, and this worker's place among them.

Read from what horovodrun puts in every worker's environment, so that it is known before
Horovod starts: the thread pools and the pinning must be set before TensorFlow starts its
runtime, which Horovod's first collective call does (a host group's names, an elastic
state's sync). On a host of its own a worker shares the machine with its host's workers
(HOROVOD_LOCAL_SIZE); on emulated hosts (`hvdtrain cluster`, which sets SHARED_MACHINE for
its command and horovodrun passes it on) the hosts are one machine, so with the whole job's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# Set by horovodrun for every worker it starts (absent in a bare process).
RANK, SIZE = "HOROVOD_RANK", "HOROVOD_SIZE"
LOCAL_RANK, LOCAL_SIZE = "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"
HOSTNAME = "HOROVOD_HOSTNAME"
# Where Gloo's workers meet at Horovod's start: the same for every worker of one job.
RENDEZVOUS = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT")
# What Open MPI's mpirun (and horovodrun --mpi, which runs it) sets instead of horovodrun's.
OPEN_MPI = {RANK: "OMPI_COMM_WORLD_RANK", SIZE: "OMPI_COMM_WORLD_SIZE",
            LOCAL_RANK: "OMPI_COMM_WORLD_LOCAL_RANK", LOCAL_SIZE: "OMPI_COMM_WORLD_LOCAL_SIZE"}
# Set by `hvdtrain cluster` for its command: the emulated hosts are one machine.
SHARED_MACHINE = "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE"


def hosts_share_one_machine(environ: Mapping[str, str]) -> bool:
    return environ.get(SHARED_MACHINE, "").strip() not in ("", "0")


@dataclass(frozen=True)
class MachineShare:
    """The `workers` horovodrun started on this machine (1 in a bare process), this
    worker's `index` among them (which cores it pins), and its `rank` in the job."""

    workers: int = 1
    index: int = 0
    rank: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "MachineShare":
        environ = with_launcher_names(environ)
        count, place = (SIZE, RANK) if hosts_share_one_machine(environ) else (LOCAL_SIZE, LOCAL_RANK)
        return cls(int(environ.get(count, "1")), int(environ.get(place, "0")),
                   int(environ.get(RANK, "0")))


def with_launcher_names(environ: Mapping[str, str]) -> Mapping[str, str]:
    """`environ` with horovodrun's names filled in from Open MPI's where horovodrun set none:
    under mpirun a worker knows its place before Horovod starts all the same."""
    if RANK in environ or OPEN_MPI[RANK] not in environ:
        return environ
    return {**environ, **{ours: environ[theirs] for ours, theirs in OPEN_MPI.items()
                          if theirs in environ}}


def shares_the_machine(mine: Mapping[str, str], theirs: Mapping[str, str]) -> bool:
    """Whether the process whose environment is `theirs` is a worker counted in the
    MachineShare that `mine` gives: one of the same job (the same rendezvous), and of
    the same host unless the hosts share one machine. False outside horovodrun."""
    if RANK not in theirs or any(mine.get(key) is None or theirs.get(key) != mine[key]
                                 for key in RENDEZVOUS):
        return False
    return hosts_share_one_machine(mine) or theirs.get(HOSTNAME) == mine.get(HOSTNAME)
