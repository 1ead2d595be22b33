"""The maths of compressed rounds (hvdtrain.quantize): encodings, their error, their bytes."""

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import quantize
from hvdtrain.quantize import CHUNK


def chunks_of(rng, count: int) -> np.ndarray:
    """`count` chunks of float32 values, each of its own magnitude (1e-6 to 1e3)."""
    magnitudes = 10.0 ** rng.uniform(-6, 3, size=(count, 1))
    return (rng.normal(size=(count, CHUNK)) * magnitudes).astype(np.float32).ravel()


def test_int8_round_trip_is_off_by_at_most_half_a_step_of_its_chunk():
    values = chunks_of(np.random.default_rng(0), 6)
    back = quantize.round_trip(tf.constant(values), "int8").numpy()
    largest = np.abs(values.reshape(-1, CHUNK)).max(axis=1, keepdims=True)
    error = np.abs(back - values).reshape(-1, CHUNK)
    assert np.all(error <= largest / 254 * (1 + 1e-5))
    # A chunk's largest value is a code of ±127 exactly, up to the scale's rounding.
    np.testing.assert_allclose(np.abs(back.reshape(-1, CHUNK)).max(axis=1, keepdims=True),
                               largest, rtol=1e-6)


def test_int8_keeps_zero_chunks_and_zeros_exact():
    values = np.zeros(2 * CHUNK, np.float32)
    values[CHUNK + 5] = -3.0
    back = quantize.round_trip(tf.constant(values), "int8").numpy()
    np.testing.assert_array_equal(back, values)


def test_fp16_round_trip_is_float16_rounding():
    values = chunks_of(np.random.default_rng(1), 2) / 1e3  # within float16's range
    back = quantize.round_trip(tf.constant(values), "fp16").numpy()
    np.testing.assert_array_equal(back, values.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("compression", ["fp16", "int8"])
def test_encoded_rows_decode_shard_by_shard(compression):
    values = chunks_of(np.random.default_rng(2), 6)
    rows = quantize.encode(tf.constant(values), 3, compression)
    assert rows.shape[0] == 3 and rows.dtype == (tf.int8 if compression == "int8" else tf.float16)
    whole = quantize.round_trip(tf.constant(values), compression).numpy()
    # Each row decodes on its own to its third of the vector: a shard needs no other row.
    for r in range(3):
        np.testing.assert_array_equal(quantize.decode(rows[r:r + 1], compression).numpy()[0],
                                      whole.reshape(3, -1)[r])


def test_a_rounds_payload_is_its_codes_and_scales_padded_to_whole_shards():
    # 5,000 values at 4 workers: 2 chunks a shard, 8 in all: 8 KiB of codes, 32 bytes of scales.
    assert quantize.padded_length(5000, 4, "int8") == 8 * CHUNK
    assert quantize.payload_bytes(5000, 4, "int8") == 8 * CHUNK + 8 * 4
    # float16 pads to whole shards only: 5,000 values are 2 bytes each.
    assert quantize.payload_bytes(5000, 4, "fp16") == 2 * 5000
    assert quantize.payload_bytes(5001, 4, "fp16") == 2 * 5004
    # Unpadded, int8 is float32's bytes over 4 / (1 + 4 / 1024): 3.98 times fewer.
    n = 8 * CHUNK * 100
    assert 4 * n / quantize.payload_bytes(n, 8, "int8") == 4 / (1 + 4 / CHUNK)
