"""The hosts' layout as horovodrun tells it to each worker, so that the hierarchy's host
and peer groups can be handed to Horovod when it starts.

Why at the start: process sets added later need Horovod's dynamic mode, and in that mode
every worker's background loop gathers two integers from every other worker each cycle
(1 ms by default) to agree on sets being added or removed (Horovod 0.28.1,
`ProcessSetTable::InitializeRegisteredAndRemoveMarkedIfReady`). Between emulated hosts
that coordination crossed the NICs more than LeNet's rounds did (BENCHMARKS.md, "What
crosses a host's NIC").

Horovod's Gloo launcher tells each worker only its own place (rank, local and cross rank
and size), and two workers of different layouts can see the same place: rank 1 of hosts
of 3, 1 and 2 sees what rank 1 of two hosts of 3 does. Workers that chose differently
would start Horovod with different sets, which fails only after Gloo's timeout. So
hvdtrain's horovodrun (`hvdtrain.machine.horovodrun`) also gives every worker every host's
worker count (`HOST_SIZES`), the same text for all, and only that decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

# What horovodrun's Gloo launcher sets for each worker (horovod/runner/gloo_run.py). Under
# mpirun these are absent, and in an elastic job they are the first launch's.
PLACE_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                   "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
ELASTIC = "HOROVOD_ELASTIC"
# Every host's worker count in rank order, e.g. "2,2,2", set by hvdtrain's horovodrun.
HOST_SIZES = "HVDTRAIN_HOST_SIZES"


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
        return peer_groups(self.host_sets())

    def process_sets(self) -> list[list[int]]:
        """The sets the hierarchy uses, in the order every worker registers them: none on
        one host, where a host's group is all the workers."""
        if self.hosts < 2:
            return []
        return self.host_sets() + self.peer_sets()


def peer_groups(host_groups: list[list[int]]) -> list[list[int]]:
    """The workers at each place in hosts of equal size: each host's first, then each
    host's second, and so on."""
    return [list(place) for place in zip(*host_groups)]


def host_sizes(slots: Iterable) -> str:
    """`HOST_SIZES` for horovodrun's slot assignment (objects with `hostname` and `rank`):
    each host's worker count, hosts in the order of their first rank."""
    counts: dict[str, int] = {}
    for slot in sorted(slots, key=lambda slot: slot.rank):
        counts[slot.hostname] = counts.get(slot.hostname, 0) + 1
    return ",".join(str(count) for count in counts.values())


def sizes_from_environment(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """Each host's workers as hvdtrain's horovodrun started the job (`HOST_SIZES`, the same
    for every worker), or None when another launcher started it."""
    try:
        return tuple(int(size) for size in env[HOST_SIZES].split(","))
    except (KeyError, ValueError):
        return None


def hosts_from_environment(env: Mapping[str, str]) -> int | None:
    """How many hosts hvdtrain's horovodrun started the job on, or None when another
    launcher started it."""
    sizes = sizes_from_environment(env)
    return None if sizes is None else len(sizes)


def layout_from_environment(env: Mapping[str, str]) -> HostLayout | None:
    """The layout when hvdtrain's horovodrun says every host has as many workers, and this
    worker's own place agrees; else None (the sets are then made after the start)."""
    if env.get(ELASTIC) == "1":
        return None
    sizes = sizes_from_environment(env)
    try:
        rank, size, local_rank, local_size, cross_rank, cross_size = (
            int(env[name]) for name in PLACE_VARIABLES)
    except (KeyError, ValueError):
        return None
    if sizes is None:
        return None
    if set(sizes) != {local_size} or len(sizes) != cross_size or sum(sizes) != size:
        return None
    if rank != cross_rank * local_size + local_rank:
        return None
    return HostLayout(cross_size, local_size)
