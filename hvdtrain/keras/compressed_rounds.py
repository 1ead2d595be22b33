"""A round's mean sent compressed (float16 or int8), with error feedback.

What travels is each worker's change since the last consensus (the pseudo-gradient, up to
its sign), plus what its last quantisation cut off: a reduce-scatter as an alltoall, each
worker summing its own shard, then an allgather of the encoded sums
(`hvdtrain.quantize`). Every worker decodes the same gathered bytes, so all take
bit-identical values.

Error feedback at both encodings: a worker keeps what encoding its own change cut off
and adds it to its next round's change; the owner of a shard also keeps what encoding the
shard's mean cut off, times the number of workers, since it re-enters that mean as one
worker's of W. What a round loses is so only delayed to the next round.

The residual is this worker's own, kept as long as the set of values: not in checkpoints
(a resumed run starts with none), and cleared whenever all workers hold the same state
(`reset`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import tensorflow as tf

from hvdtrain import comm, quantize


class CompressedExchange:
    """The workers' mean of values shaped like `like` (tensors or variables, any float
    dtype), sent as `compression` ("fp16" or "int8")."""

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

    @property
    def payload_bytes(self) -> int:
        """Bytes one worker hands to a round with the current workers (codes and scales)."""
        return quantize.payload_bytes(self.length, comm.size(), self.compression)

    def mean(self, values: Sequence[tf.Tensor], name: str, share: float | None = None,
             feedback: bool = True) -> list[tf.Tensor]:
        """The workers' mean of `values` (one tensor each, shaped like `like`). `share`:
        a sum instead, of each worker's values times its share (a hand-over from rank 0
        gives it 1, the others 0); its residual is scaled too, since its state is thrown
        away. `feedback`: keep this round's residual (False for a look at the mean that is
        no round). Eager or traced; the number of workers and the rank are read when traced."""
        workers = comm.size()
        meant = comm.flatten([tf.cast(v, tf.float32) for v in values]) + self.residual
        if share is not None:
            meant = meant * share
        padded_length = quantize.padded_length(self.length, workers, self.compression)
        padded = tf.pad(meant, [[0, padded_length - self.length]])
        chunk = quantize.chunk_length(self.length, workers)
        encode = functools.partial(quantize.encode, compression=self.compression, chunk=chunk)
        decode = functools.partial(quantize.decode, compression=self.compression, chunk=chunk)
        rows = encode(padded, workers)
        shards = decode(comm.alltoall(rows, name=f"{name}_scatter"))
        shard = tf.reduce_sum(shards, axis=0)  # in rank order, on this worker only
        if share is None:
            shard = shard / workers
        summed = encode(shard, 1)
        gathered = comm.allgather(summed, name=f"{name}_gather")
        means = decode(gathered)  # a row per worker's shard, in rank order
        result = tf.reshape(means, [-1])[:self.length]
        if feedback:  # this worker's own row of `means` is what its `summed` decodes to
            self._keep_residual(padded, decode(rows), shard, means[comm.rank()], workers)
        pieces = comm.unflatten(result, values)
        return [tf.cast(p, v.dtype) for p, v in zip(pieces, values)]

    def _keep_residual(self, padded, sent, shard, summed, workers: int) -> None:
        """`sent` and `summed`: what this worker's rows and its shard's sum decode to."""
        own_cut = padded - tf.reshape(sent, [-1])
        shard_cut = (shard - summed) * workers
        width = shard.shape[0]
        start = comm.rank() * width
        owner_cut = tf.pad(shard_cut, [[start, padded.shape[0] - start - width]])
        self.residual.assign((own_cut + owner_cut)[:self.length])
