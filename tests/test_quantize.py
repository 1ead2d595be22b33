"""The maths of compressed rounds (hvdtrain.rounds.quantize): encodings, their error, their bytes."""

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.rounds import quantize
from hvdtrain.rounds.quantize import CHUNK


def chunks_of(rng, count: int) -> np.ndarray:
    """`count` chunks of float32 values, each of its own magnitude (1e-6 to 1e3)."""
    magnitudes = 10.0 ** rng.uniform(-6, 3, size=(count, 1))
    return (rng.normal(size=(count, CHUNK)) * magnitudes).astype(np.float32).ravel()


@pytest.mark.parametrize("compression", ["int8", "int4"])
def test_a_coded_round_trip_is_off_by_at_most_half_a_step_of_its_chunk(compression):
    levels = quantize.LEVELS[compression]  # 127 or 7 steps either side of 0
    values = chunks_of(np.random.default_rng(0), 6)
    back = quantize.round_trip(tf.constant(values), compression).numpy()
    largest = np.abs(values.reshape(-1, CHUNK)).max(axis=1, keepdims=True)
    error = np.abs(back - values).reshape(-1, CHUNK)
    assert np.all(error <= largest / (2 * levels) * (1 + 1e-5))
    assert np.all(np.isin(np.round(back.reshape(-1, CHUNK) / (largest / levels)),
                          np.arange(-levels, levels + 1)))
    # A chunk's largest value is a code of ±levels exactly, up to the scale's rounding.
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


@pytest.mark.parametrize("compression", ["fp16", "int8", "int4", "int2", "int1", "topk"])
def test_encoded_rows_decode_shard_by_shard(compression):
    values = chunks_of(np.random.default_rng(2), 6)
    rows = quantize.encode(tf.constant(values), 3, compression)
    assert rows.shape[0] == 3 and rows.dtype == (tf.float16 if compression == "fp16" else tf.int8)
    whole = quantize.round_trip(tf.constant(values), compression).numpy()
    # Each row decodes on its own to its third of the vector: a shard needs no other row.
    for r in range(3):
        np.testing.assert_array_equal(quantize.decode(rows[r:r + 1], compression).numpy()[0],
                                      whole.reshape(3, -1)[r])


def test_a_rounds_payload_is_its_codes_and_scales_padded_to_whole_shards():
    # 5,000 values at 4 workers: 1,250 a shard, as 2 chunks of 625: no padding, 8 scales.
    assert quantize.chunk_length(5000, 4) == 625
    assert quantize.padded_length(5000, 4, "int8") == 5000
    assert quantize.payload_bytes(5000, 4, "int8") == 5000 + 8 * 4
    # 5,001: shards of 1,251, as 2 chunks of 626: 5,008 values.
    assert quantize.padded_length(5001, 4, "int8") == 4 * 2 * 626
    # float16 pads to whole shards only: 5,000 values are 2 bytes each.
    assert quantize.payload_bytes(5000, 4, "fp16") == 2 * 5000
    assert quantize.payload_bytes(5001, 4, "fp16") == 2 * 5004
    # Unpadded, int8 is float32's bytes over 4 / (1 + 4 / 1024): 3.98 times fewer.
    n = 8 * CHUNK * 100
    assert 4 * n / quantize.payload_bytes(n, 8, "int8") == 4 / (1 + 4 / CHUNK)


@pytest.mark.parametrize("values,workers", [(61706, 8), (61706, 128), (1, 3), (1024, 1),
                                            (1025, 1), (270_000, 64), (25_557_032, 64)])
def test_int8_chunks_are_at_most_1024_values_and_pad_under_one_value_a_chunk(values, workers):
    # LeNet's 61,706 values at 8 workers used to pad to 65,536 (6% more) and at 128
    # workers to 131,072 (112% more): a whole chunk per shard.
    chunk, length = quantize.chunk_length(values, workers), quantize.padded_length(values, workers, "int8")
    assert 1 <= chunk <= CHUNK
    assert length % (workers * chunk) == 0
    shard, chunks = -(-values // workers), length // workers // chunk
    assert length - values < workers * (chunks + 1)  # under a value a chunk and one a shard
    assert (chunks - 1) * CHUNK < shard  # the fewest chunks: one fewer could not hold a shard


def test_a_round_of_short_chunks_decodes_shard_by_shard_and_keeps_each_chunks_scale():
    rng = np.random.default_rng(3)
    values, workers = 3 * 2 * 700, 3  # shards of 1,400 values as 2 chunks of 700
    chunk = quantize.chunk_length(values, workers)
    assert chunk == 700
    data = (rng.normal(size=(6, chunk)) * 10.0 ** rng.uniform(-4, 2, size=(6, 1))).astype(np.float32)
    rows = quantize.encode(tf.constant(data.ravel()), workers, "int8", chunk)
    assert rows.shape == (workers, 2 * chunk + 2 * 4)
    back = quantize.decode(rows, "int8", chunk).numpy().reshape(6, chunk)
    largest = np.abs(data).max(axis=1, keepdims=True)
    assert np.all(np.abs(back - data) <= largest / 254 * (1 + 1e-5))
    np.testing.assert_allclose(np.abs(back).max(axis=1, keepdims=True), largest, rtol=1e-6)


def test_int4_packs_every_code_two_to_a_byte_and_back():
    codes = tf.constant([*range(-7, 8), 0], tf.int8)
    packed = quantize.pack_int4(codes)
    assert packed.dtype == tf.int8 and packed.shape == (8,)
    # The first code of a pair in the low half, the second in the high, each plus 8.
    assert int(tf.bitcast(packed, tf.uint8)[0]) == (-7 + 8) | ((-6 + 8) << 4)
    np.testing.assert_array_equal(quantize.unpack_int4(packed).numpy(), codes.numpy())


def test_int4_chunks_are_even_and_its_payload_half_a_byte_a_value_and_the_scales():
    # 5,001 values at 4 workers: shards of 1,251 as 2 chunks of 626 (even already): as int8.
    assert quantize.chunk_length(5001, 4, "int4") == 626
    assert quantize.payload_bytes(5001, 4, "int4") == 4 * 2 * 626 // 2 + 8 * 4
    # 3 values at 1 worker: a chunk of 3 for int8, of 4 for int4 (a byte holds two codes).
    assert (quantize.chunk_length(3, 1), quantize.chunk_length(3, 1, "int4")) == (3, 4)
    assert quantize.padded_length(3, 1, "int4") == 4
    assert quantize.payload_bytes(3, 1, "int4") == 2 + 4
    rows = quantize.encode(tf.constant([1.0, -2.0, 3.5, 0.0]), 1, "int4", 4)
    assert rows.shape == (1, 2 + 4)
    np.testing.assert_allclose(quantize.decode(rows, "int4", 4).numpy(),
                               [[1.0, -2.0, 3.5, 0.0]], atol=3.5 / 14)


def test_topk_keeps_each_chunks_largest_values_to_half_a_step_and_zeros_the_rest():
    chunk, keep = quantize.TOPK_CHUNK, quantize.TOPK_KEEP
    values = chunks_of(np.random.default_rng(5), 3)  # 12 topk chunks of their own sizes
    back = quantize.round_trip(tf.constant(values), "topk").numpy().reshape(-1, chunk)
    values = values.reshape(-1, chunk)
    largest = np.argsort(-np.abs(values), axis=1)[:, :keep]
    for row, kept in enumerate(largest):
        assert set(np.flatnonzero(back[row])) == set(kept)
        step = np.abs(values[row]).max() / quantize.LEVELS["topk"]
        assert np.all(np.abs(back[row, kept] - values[row, kept]) <= step / 2 * (1 + 1e-5))


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_a_topk_rounds_payload_is_a_code_and_a_place_a_kept_value_and_a_scale_a_chunk(workers):
    values = 272_474  # ResNet-20's weights and statistics
    length = quantize.padded_length(values, workers, "topk")
    assert length % (workers * quantize.TOPK_CHUNK) == 0
    assert length - values < workers * quantize.TOPK_CHUNK
    chunks = length // quantize.TOPK_CHUNK
    assert quantize.payload_bytes(values, workers, "topk") == chunks * (
        2 * quantize.TOPK_KEEP + quantize.SCALE_BYTES)
    rows = quantize.encode(tf.zeros([length]), workers, "topk")
    assert rows.shape == (workers, chunks // workers * (2 * quantize.TOPK_KEEP + 4))


def test_int2_sends_each_value_as_its_sign_times_its_chunks_mean_magnitude_or_0():
    values = chunks_of(np.random.default_rng(6), 4)
    back = quantize.round_trip(tf.constant(values), "int2").numpy().reshape(-1, CHUNK)
    values = values.reshape(-1, CHUNK)
    scale = np.abs(values).mean(axis=1, keepdims=True)
    want = np.where(np.abs(values) < scale / 2, 0.0, np.sign(values)) * scale
    np.testing.assert_allclose(back, want, rtol=1e-6)
    codes = np.array([-1, 0, 1, 1, 0, -1, -1, 1], np.int8)
    packed = quantize.pack_int2(tf.constant(codes))
    assert packed.shape == (2,)
    np.testing.assert_array_equal(quantize.unpack_int2(packed).numpy(), codes)


@pytest.mark.parametrize("values,workers", [(61706, 8), (272_474, 4), (5, 3)])
def test_int2_chunks_hold_whole_bytes_and_its_payload_is_a_quarter_byte_a_value(values, workers):
    chunk = quantize.chunk_length(values, workers, "int2")
    assert chunk % 4 == 0 and chunk <= CHUNK
    length = quantize.padded_length(values, workers, "int2")
    assert quantize.payload_bytes(values, workers, "int2") == length // 4 + 4 * (length // chunk)


def test_int1_sends_each_value_as_its_sign_times_its_chunks_mean_magnitude():
    values = chunks_of(np.random.default_rng(7), 3)
    values[5] = 0.0  # 0 goes as +
    back = quantize.round_trip(tf.constant(values), "int1").numpy().reshape(-1, CHUNK)
    values = values.reshape(-1, CHUNK)
    scale = np.abs(values).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(back, np.where(values < 0, -1.0, 1.0) * scale, rtol=1e-6)
    codes = np.array([1, -1, -1, 1, 1, 1, -1, 1, -1, -1, -1, -1, 1, 1, 1, 1], np.int8)
    packed = quantize.pack_int1(tf.constant(codes))
    assert packed.shape == (2,)
    np.testing.assert_array_equal(quantize.unpack_int1(packed).numpy(), codes)
    assert quantize.chunk_length(61706, 8, "int1") % 8 == 0
    assert quantize.payload_bytes(8192, 1, "int1") == 8192 // 8 + 4 * 8
