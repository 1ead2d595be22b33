"""A round's mean sent compressed (float16, int8, int4, int2, int1 or top-k), with error
feedback.

What travels is each worker's change since the last consensus (the pseudo-gradient, up to
its sign), plus what its last quantisation cut off: a reduce-scatter as an alltoall, each
worker summing its own shard, then an allgather of the encoded sums
(`hvdtrain.rounds.quantize`). Every worker decodes the same gathered bytes, so all take
bit-identical values.

Error feedback at both encodings: a worker keeps what encoding its own change cut off
and adds it to its next round's change; the owner of a shard also keeps what encoding the
shard's mean cut off, times the number of workers, since it re-enters that mean as one
worker's of W; a hand-over's sender keeps its own cut times W as well, since the
hand-over is a sum that every worker takes whole. What a round loses is so only delayed to
the next round.

The residual is this worker's own, kept as long as the set of workers: it is not in
checkpoints, so a resumed run (a new set of workers, started from a broadcast) starts with
none and loses what the last round before the save still owed, one round's encoding error;
nothing else clears it (`reset`, called for a new set of workers only).
"""

from __future__ import annotations

import functools
from typing import Sequence

import tensorflow as tf

from hvdtrain import comm
from hvdtrain.rounds import quantize
from hvdtrain.keras.host_shards import HostShards


class CompressedExchange:
    """The workers' mean of values shaped like `like` (tensors or variables, any float
    dtype), sent as `compression` ("fp16", "int8", "int4", "int2", "int1" or "topk")."""

    def __init__(self, like: Sequence, compression: str):
        if compression not in quantize.COMPRESSED:
            raise ValueError(f"compression must be one of {quantize.COMPRESSED}, "
                             f"got {compression!r}")
        self.compression = compression
        self.length = sum(int(v.shape.num_elements()) for v in like)
        self.residual = tf.Variable(tf.zeros([self.length]), trainable=False)

    def reset(self) -> None:
        """Drop the residual: every worker holds the same state."""
        self.residual.assign(tf.zeros_like(self.residual))

    def payload_bytes(self, shards: HostShards | None = None) -> int:
        """Bytes one worker hands to a round with the current workers (codes and scales);
        with `shards`, to its shard's round among its peers, the bytes that cross hosts."""
        if shards is None:
            return quantize.payload_bytes(self.length, comm.size(), self.compression)
        return quantize.payload_bytes(shards.width(self.length), shards.peers.size,
                                      self.compression)

    def mean(self, values: Sequence[tf.Tensor], name: str, share: float | None = None,
             feedback: bool = True, shards: HostShards | None = None) -> list[tf.Tensor]:
        """The workers' mean of `values` (one tensor each, shaped like `like`). `share`:
        a sum instead, of each worker's values times its share (a hand-over from rank 0
        gives it 1, the others 0); its residual is scaled too, since its state is thrown
        away. `feedback`: keep this round's residual (False for a look at the mean that is
        no round). `shards`: this worker sends only its shard, among its peers in the other
        hosts, and its host's workers gather the rest (a host's workers hold the same
        values). Eager or traced; the workers and the rank are read when traced."""
        if shards is not None and share is not None:
            raise ValueError("a round cut in host shards takes no share: it is a mean")
        meant = comm.flatten([tf.cast(v, tf.float32) for v in values]) + self.residual
        if share is not None:
            meant = meant * share
        if shards is None:
            result = self._mean_among(meant, name, share, feedback, None)
        else:
            part = self._mean_among(shards.mine(meant), name, share, feedback, shards)
            result = shards.whole(part, self.length, name)
        pieces = comm.unflatten(result, values)
        return [tf.cast(p, v.dtype) for p, v in zip(pieces, values)]

    def _mean_among(self, meant: tf.Tensor, name: str, share, feedback: bool,
                    shards: HostShards | None) -> tf.Tensor:
        """The mean (or shared sum) of `meant` among all the workers, or among this
        worker's peers for its shard; padded past `meant`'s length."""
        group = None if shards is None else shards.peers
        workers, me = (comm.size(), comm.rank()) if group is None else (group.size, group.index)
        length = int(meant.shape[0])
        padded_length = quantize.padded_length(length, workers, self.compression)
        padded = tf.pad(meant, [[0, padded_length - length]])
        chunk = quantize.chunk_length(length, workers, self.compression)
        encode = functools.partial(quantize.encode, compression=self.compression, chunk=chunk)
        decode = functools.partial(quantize.decode, compression=self.compression, chunk=chunk)
        rows = encode(padded, workers)
        shards_got = decode(comm.alltoall(rows, name=f"{name}_scatter", group=group))
        shard = tf.reduce_sum(shards_got, axis=0)  # in rank order, on this worker only
        if share is None:
            shard = shard / workers
        summed = encode(shard, 1)
        gathered = comm.allgather(summed, name=f"{name}_gather", group=group)
        means = decode(gathered)  # a row per worker's shard, in rank order
        if feedback:  # this worker's own row of `means` is what its `summed` decodes to
            cut = _residual(padded, decode(rows), shard, means[me], workers, me,
                            shared=share is not None)
            self._keep_residual(cut[:length], shards)
        return tf.reshape(means, [-1])[:length]

    def _keep_residual(self, cut: tf.Tensor, shards: HostShards | None) -> None:
        """What this round cut off, for the whole vector or for this worker's host shard
        (the rest of the vector is its host peers' to keep)."""
        if shards is None:
            self.residual.assign(cut)
            return
        start, stop = shards.bounds(self.length)
        stop = min(stop, self.length)
        self.residual.assign(tf.concat(
            [self.residual[:start], cut[:stop - start], self.residual[stop:]], axis=0))


def _residual(padded, sent, shard, summed, workers: int, me: int,
              shared: bool = False) -> tf.Tensor:
    """What a round cut off: this worker's own (`padded` less what its rows, `sent`,
    decode to) and, at its shard's place, the shard's sum less what it decodes to
    (`summed`), times the workers, since it re-enters the mean as one worker's of W.
    In a `shared` round (a hand-over) the sender's own cut is a cut of the sum every
    worker took, not of a W-th of a mean: it is kept times the workers too, or the next
    mean round would deliver only a W-th of it."""
    own_cut = padded - tf.reshape(sent, [-1])
    if shared:
        own_cut = own_cut * workers
    shard_cut = (shard - summed) * workers
    width = shard.shape[0]
    start = me * width
    return own_cut + tf.pad(shard_cut, [[start, padded.shape[0] - start - width]])
