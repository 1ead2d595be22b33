"""The hosts' layout as horovodrun tells it to each worker, so that the hierarchy's host
and peer groups can be handed to Horovod when it starts.

Why at the start: process sets added later need Horovod's dynamic mode, and in that mode
every worker's background loop gathers two integers from every other worker each cycle
(1 ms by default) to agree on sets being added or removed (Horovod 0.28.1,
`ProcessSetTable::InitializeRegisteredAndRemoveMarkedIfReady`). Between emulated hosts
that coordination crossed the NICs more than LeNet's rounds did (BENCHMARKS.md, "What
crosses a host's NIC").

Pure functions of the environment: each worker reads only its own place, and the test
below is one that every worker passes only when the hosts are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# What horovodrun's Gloo launcher sets for each worker (horovod/runner/gloo_run.py). Under
# mpirun these are absent, and in an elastic job they are the first launch's.
PLACE_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                   "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
ELASTIC = "HOROVOD_ELASTIC"


@dataclass(frozen=True)
class HostLayout:
    """`hosts` hosts of `per_host` workers each, ranked host by host."""

    hosts: int
    per_host: int

    def host_sets(self) -> list[list[int]]:
        """Each host's workers, host by host."""
        return [[host * self.per_host + place for place in range(self.per_host)]
                for host in range(self.hosts)]

    def peer_sets(self) -> list[list[int]]:
        """The workers at each place in every host, place by place; none when a host has
        one worker (the one set would be all the workers)."""
        if self.per_host < 2:
            return []
        return [[host * self.per_host + place for host in range(self.hosts)]
                for place in range(self.per_host)]

    def process_sets(self) -> list[list[int]]:
        """The sets the hierarchy uses, in the order every worker registers them: none on
        one host, where a host's group is all the workers."""
        if self.hosts < 2:
            return []
        return self.host_sets() + self.peer_sets()


def layout_from_environment(env: Mapping[str, str]) -> HostLayout | None:
    """The layout when horovodrun's environment shows this worker on one of equal hosts,
    ranked host by host; else None (and the sets are then made after the start).

    A worker's cross size counts the hosts that have a worker at its local rank, so on the
    last worker of a host of L the test `L * cross size == size` holds only if every host
    has exactly L workers. Other workers can pass it on unequal hosts ([2, 1, 3]: rank 0
    does); they then start Horovod with sets where the last workers start it without, and
    Horovod's start fails on the former (`comm.init` says so in one line).
    """
    if env.get(ELASTIC) == "1":
        return None
    try:
        rank, size, local_rank, local_size, cross_rank, cross_size = (
            int(env[name]) for name in PLACE_VARIABLES)
    except (KeyError, ValueError):
        return None
    if local_size * cross_size != size or rank != cross_rank * local_size + local_rank:
        return None
    return HostLayout(cross_size, local_size)
