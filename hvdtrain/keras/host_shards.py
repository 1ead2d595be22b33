"""A round across hosts cut in shards, one per place in a host (hierarchical local SGD).

In hierarchical local SGD a host's workers hold one model: they average gradients every
step. A round among all the workers would average that model as W workers' copies of it:
a ring crosses each host's NIC with 2(W-1)/W of it, and an int8 round's alltoall sends
each worker's pieces straight to every worker of the other hosts. Instead a host's
workers split it: the i-th worker of every host averages the i-th k-th of the state with
the other hosts' i-th workers (`comm.peer_group`), and then the host's workers gather
their shards from each other (`comm.allgather` among the host). What a worker sends
across hosts falls k-fold; a host's NIC carries 2(H-1)/H of one copy, as in Horovod's
hierarchical allreduce (measured on emulated hosts: BENCHMARKS.md).

The premise, a host's workers hold the same values, is true of weights and optimizer
slots but not of BatchNorm's moving statistics, which each worker updates from its own
batches: the averager takes their mean inside the host before the cut
(`ModelStateAverager.exchange`).

Every worker of a host ends with the same values (the gathered shards), and the i-th
workers of all hosts with the same i-th shard (one collective's result), so every worker
ends a round on the same bits. Hosts must be of one size (`comm.peer_group` is None
otherwise, and rounds go among all the workers, as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tensorflow as tf

from hvdtrain import comm


@dataclass(frozen=True)
class HostShards:
    """This worker's shard of a round: its place in its host, and its peers in the others."""

    host: comm.WorkerGroup
    peers: comm.WorkerGroup

    @classmethod
    def current(cls) -> HostShards | None:
        """The shards of the current workers, or None when rounds cannot be cut so."""
        peers = comm.peer_group()
        return None if peers is None else cls(comm.host_group(), peers)

    def width(self, length: int) -> int:
        """Values in a shard of a vector of `length`: a k-th of it, rounded up."""
        return -(-length // self.host.size)

    def bounds(self, length: int) -> tuple[int, int]:
        """Where this worker's shard lies in the vector padded to k whole shards."""
        width = self.width(length)
        start = self.host.index * width
        return start, start + width

    def mine(self, flat: tf.Tensor) -> tf.Tensor:
        """This worker's shard of the flat vector `flat` (zeros past its end)."""
        length = int(flat.shape[0])
        start, stop = self.bounds(length)
        padded = tf.pad(flat, [[0, self.host.size * self.width(length) - length]])
        return padded[start:stop]

    def whole(self, shard: tf.Tensor, length: int, name: str) -> tf.Tensor:
        """The vector of `length` from every host worker's shard of it (`mine`'s inverse)."""
        return comm.allgather(shard, name=f"{name}_host_gather", group=self.host)[:length]

    def average(self, values: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
        """The workers' mean of `values` (float tensors; a host's workers hold the same),
        in float32, each shard averaged among one place's workers."""
        flat = comm.flatten([tf.cast(v, tf.float32) for v in values])
        (mean,) = comm.average([self.mine(flat)], name=f"{name}_shard", group=self.peers)
        pieces = comm.unflatten(self.whole(mean, int(flat.shape[0]), name), values)
        return [tf.cast(p, v.dtype) for p, v in zip(pieces, values)]

    @staticmethod
    def count() -> int:
        """In how many shards a round across hosts is cut now: a host's workers (1: uncut)."""
        shards = HostShards.current()
        return 1 if shards is None else shards.host.size

    def shard_bytes(self, length: int, value_bytes: int = 4) -> int:
        """What a worker hands to a float round across hosts of `length` values."""
        return value_bytes * self.width(length)
