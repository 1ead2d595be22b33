"""The maths of compressed rounds: how a round's pseudo-gradient travels in float16 or int8.

A compressed round moves a flat float32 vector (every worker's change since the last
consensus, plus what its last quantisation cut off) as a reduce-scatter and an allgather:
the vector is padded and cut into one shard per worker; each worker sends shard r,
encoded, to worker r (an alltoall), which decodes and sums the shards it got, encodes
the sum and sends it to all (an allgather). Every worker decodes the same gathered
bytes, so all end the round with bit-identical values. An allreduce could not carry int8
codes: their sum overflows, and each worker's scales differ.

int8: a shard is cut into the fewest chunks of at most `CHUNK` values, all of one length
(`chunk_length`), so padding is under a value per chunk and per shard, not up to a whole
chunk per shard (LeNet's 61,706 values at 8 workers padded to 65,536; at 128 workers to
131,072). Each chunk has its own scale, its largest magnitude / 127, sent as 4 float32
bytes after the shard's codes; a value is rounded to the nearest of the 255 multiples of
the scale within ±127, so it is off by at most scale / 2 (1/254 of its chunk's largest).
int2 (ternary, as EF-SignSGD with a zero, Karimireddy et al. 2019): the same chunks, a scale
the mean magnitude of the chunk's values, codes -1, 0 or 1 packed four to a byte: a
value is sent as its sign times the scale, or as 0 below half of it; error feedback
carries what that cut to the next round. Every value moves in every round, as no sparse
encoding's do.
int1 (EF-SignSGD's sign): the same scale, each value sent as its sign times it (0 as +),
eight codes a byte: half of int2's bytes, no value left at 0.
int4 (as Streaming DiLoCo's 4-bit outer gradients): the same chunks and scales, a scale
the chunk's largest magnitude / 7, codes within ±7 packed two to a byte (a chunk holds an
even number of values); off by at most 1/14 of its chunk's largest, which error feedback
carries to the next round.
topk (SparseLoCo's top-k with error feedback): each chunk of `TOPK_CHUNK` values keeps its
`TOPK_KEEP` largest magnitudes, as int8 codes of one scale, each with its place in the
chunk as a uint8; the rest decode to 0 and stay in the sender's residual. The shard's
owner keeps the top-k of the shard's sum in the same way, so the allgather is as sparse.
float16: no scales, each value rounded to float16.

All functions are pure, on TensorFlow tensors (eager or traced); the byte counts
(`padded_length`, `payload_bytes`) are `hvdtrain.rounds.payload`'s, which needs none.
"""

from __future__ import annotations

import tensorflow as tf

# The byte arithmetic lives with the rounds, free of TensorFlow; re-exported here.
from hvdtrain.rounds.payload import (CHUNK, CODED, COMPRESSED, INT8_LEVELS,  # noqa: F401
                                     LEVELS, SCALE_BYTES, TOPK_CHUNK, TOPK_KEEP,
                                     VALUE_BYTES, chunk_length, padded_length,
                                     payload_bytes)


def quantize_chunks(values: tf.Tensor, chunk: int = CHUNK, levels: int = INT8_LEVELS,
                    mean_scale: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """Codes within ±`levels`, as int8, and one float32 scale per `chunk` float32 `values`
    (whole chunks): the chunk's largest magnitude over `levels`, or with `mean_scale` its
    mean magnitude (int2's)."""
    chunks = tf.reshape(values, [-1, chunk])
    magnitudes = tf.abs(chunks)
    scales = (tf.reduce_mean(magnitudes, axis=1) if mean_scale
              else tf.reduce_max(magnitudes, axis=1) / levels)
    # An all-zero chunk has scale 0: its codes are 0, and decode to exactly 0.
    codes = tf.round(tf.math.divide_no_nan(chunks, scales[:, None]))
    codes = tf.clip_by_value(codes, -levels, levels)
    return tf.reshape(tf.cast(codes, tf.int8), [-1]), scales


def sign_chunks(values: tf.Tensor, chunk: int) -> tuple[tf.Tensor, tf.Tensor]:
    """int1's codes, each value's sign (+1 for 0) as int8, and one scale per `chunk`
    float32 `values`, their mean magnitude (an all-zero chunk decodes to 0 by it)."""
    chunks = tf.reshape(values, [-1, chunk])
    scales = tf.reduce_mean(tf.abs(chunks), axis=1)
    codes = tf.where(chunks < 0, tf.constant(-1, tf.int8), tf.constant(1, tf.int8))
    return tf.reshape(codes, [-1]), scales


def dequantize_chunks(codes: tf.Tensor, scales: tf.Tensor) -> tf.Tensor:
    """The float32 values `codes` (int8, unpacked) with their chunks' `scales` stand for."""
    chunks = tf.reshape(tf.cast(codes, tf.float32), [tf.shape(scales)[0], -1]) * scales[:, None]
    return tf.reshape(chunks, [-1])


def pack_int2(codes: tf.Tensor) -> tf.Tensor:
    """Codes within ±1 (a multiple of 4 of them), four to an int8 byte, the first in the
    lowest two bits, each offset by 1 to 0..2."""
    quads = tf.reshape(tf.cast(codes, tf.int32) + 1, [-1, 4])
    packed = quads[:, 0]
    for k in range(1, 4):
        packed = tf.bitwise.bitwise_or(packed, tf.bitwise.left_shift(quads[:, k], 2 * k))
    return tf.bitcast(tf.cast(packed, tf.uint8), tf.int8)


def unpack_int2(packed: tf.Tensor) -> tf.Tensor:
    """`pack_int2`'s bytes back to their int8 codes, in order."""
    byte = tf.cast(tf.bitcast(packed, tf.uint8), tf.int32)
    codes = [tf.bitwise.bitwise_and(tf.bitwise.right_shift(byte, 2 * k), 3) - 1 for k in range(4)]
    return tf.cast(tf.reshape(tf.stack(codes, axis=-1), [-1]), tf.int8)


def pack_int1(codes: tf.Tensor) -> tf.Tensor:
    """Codes of -1 or 1 (a multiple of 8 of them), eight to an int8 byte, the first in the
    lowest bit, a set bit for 1."""
    bits = tf.reshape(tf.cast(codes > 0, tf.int32), [-1, 8])
    packed = tf.reduce_sum(bits * tf.bitwise.left_shift(1, tf.range(8)), axis=1)
    return tf.bitcast(tf.cast(packed, tf.uint8), tf.int8)


def unpack_int1(packed: tf.Tensor) -> tf.Tensor:
    """`pack_int1`'s bytes back to their int8 codes, in order."""
    byte = tf.cast(tf.bitcast(packed, tf.uint8), tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(byte[:, None], tf.range(8)), 1)
    return tf.cast(tf.reshape(2 * bits - 1, [-1]), tf.int8)


def pack_int4(codes: tf.Tensor) -> tf.Tensor:
    """Codes within ±7 (an even number of them), two to an int8 byte: the first in the low
    half, the second in the high, each offset by 8 to 1..15."""
    pairs = tf.reshape(tf.cast(codes, tf.int32) + 8, [-1, 2])
    packed = tf.bitwise.bitwise_or(pairs[:, 0], tf.bitwise.left_shift(pairs[:, 1], 4))
    return tf.bitcast(tf.cast(packed, tf.uint8), tf.int8)


def unpack_int4(packed: tf.Tensor) -> tf.Tensor:
    """`pack_int4`'s bytes back to their int8 codes, in order."""
    byte = tf.cast(tf.bitcast(packed, tf.uint8), tf.int32)
    low = tf.bitwise.bitwise_and(byte, 15) - 8
    high = tf.bitwise.right_shift(byte, 4) - 8
    return tf.cast(tf.reshape(tf.stack([low, high], axis=-1), [-1]), tf.int8)


def encode(values: tf.Tensor, shards: int, compression: str, chunk: int = CHUNK) -> tf.Tensor:
    """float32 `values` (a `padded_length` vector) as `shards` rows, one per shard: float16
    values, or the codes of `chunk` values a scale (int4's packed) followed by their
    scales' bytes (topk: of its kept values, with their places, in chunks of `TOPK_CHUNK`)."""
    if compression == "fp16":
        return tf.reshape(tf.cast(values, tf.float16), [shards, -1])
    if compression == "topk":
        return _encode_topk(values, shards)
    codes, scales = (sign_chunks(values, chunk) if compression == "int1" else
                     quantize_chunks(values, chunk, LEVELS[compression],
                                     mean_scale=compression == "int2"))
    codes = PACK.get(compression, lambda c: c)(codes)
    # Scales travel as their bytes, so a shard is one int8 row; all workers share a byte order.
    scale_bytes = tf.bitcast(scales, tf.int8)
    return tf.concat([tf.reshape(codes, [shards, -1]),
                      tf.reshape(scale_bytes, [shards, -1])], axis=1)


def decode(rows: tf.Tensor, compression: str, chunk: int = CHUNK) -> tf.Tensor:
    """`encode`'s rows (any number of them, of the same `chunk`; topk's is always
    `TOPK_CHUNK`) back to float32, one row per shard."""
    if compression == "fp16":
        return tf.cast(rows, tf.float32)
    if compression == "topk":
        return _decode_topk(rows)
    per_chunk = int(chunk * VALUE_BYTES[compression])  # whole bytes (`chunk_length`)
    chunks = rows.shape[1] // (per_chunk + SCALE_BYTES)  # the row's width is static
    width = chunks * per_chunk
    scales = tf.bitcast(tf.reshape(rows[:, width:], [-1, SCALE_BYTES]), tf.float32)
    codes = tf.reshape(rows[:, :width], [-1])
    codes = UNPACK.get(compression, lambda c: c)(codes)
    values = dequantize_chunks(codes, scales)
    return tf.reshape(values, [-1, chunks * chunk])


# The encodings whose codes are packed several to a byte.
PACK = {"int4": pack_int4, "int2": pack_int2, "int1": pack_int1}
UNPACK = {"int4": unpack_int4, "int2": unpack_int2, "int1": unpack_int1}


def _encode_topk(values: tf.Tensor, shards: int) -> tf.Tensor:
    """Rows of each `TOPK_CHUNK` values' `TOPK_KEEP` largest magnitudes: the codes of the
    shard's chunks, then their places (uint8 bytes), then their scales' bytes."""
    chunks = tf.reshape(values, [-1, TOPK_CHUNK])
    _, places = tf.math.top_k(tf.abs(chunks), TOPK_KEEP, sorted=False)
    kept = tf.gather(chunks, places, batch_dims=1)
    codes, scales = quantize_chunks(tf.reshape(kept, [-1]), TOPK_KEEP, LEVELS["topk"])
    place_bytes = tf.bitcast(tf.cast(places, tf.uint8), tf.int8)
    return tf.concat([tf.reshape(codes, [shards, -1]), tf.reshape(place_bytes, [shards, -1]),
                      tf.reshape(tf.bitcast(scales, tf.int8), [shards, -1])], axis=1)


def _decode_topk(rows: tf.Tensor) -> tf.Tensor:
    """`_encode_topk`'s rows back to float32: each chunk's kept values at their places, 0
    elsewhere."""
    chunks = rows.shape[1] // (2 * TOPK_KEEP + SCALE_BYTES)  # the row's width is static
    width = chunks * TOPK_KEEP
    scales = tf.bitcast(tf.reshape(rows[:, 2 * width:], [-1, SCALE_BYTES]), tf.float32)
    kept = dequantize_chunks(tf.reshape(rows[:, :width], [-1]), scales)
    places = tf.cast(tf.bitcast(tf.reshape(rows[:, width:2 * width], [-1, TOPK_KEEP]),
                                tf.uint8), tf.int32)
    # Each kept value's place in the whole vector: its chunk's start plus its place in it.
    starts = tf.range(tf.shape(places)[0]) * TOPK_CHUNK
    where = tf.reshape(places + starts[:, None], [-1, 1])
    dense = tf.scatter_nd(where, kept, [tf.shape(places)[0] * TOPK_CHUNK])
    return tf.reshape(dense, [-1, chunks * TOPK_CHUNK])


def round_trip(values: tf.Tensor, compression: str, chunk: int = CHUNK) -> tf.Tensor:
    """What `values` (whole chunks) decode to after encoding: what a send of them stands for."""
    return tf.reshape(decode(encode(values, 1, compression, chunk), compression, chunk), [-1])
