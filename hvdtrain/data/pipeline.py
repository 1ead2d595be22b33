"""tf.data building blocks shared by the readers."""

from __future__ import annotations

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


# Far more epochs than any run; the stream is endless in practice.
EPOCH_LIMIT = 1 << 40


def epoch_permutation(size: int, seed: int, epoch) -> tf.Tensor:
    """The order of one epoch: a function of (seed, epoch) only, so a resumed run can rebuild it."""
    return tf.random.experimental.stateless_shuffle(
        tf.range(size, dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), epoch]))


def shuffled_indices(size: int, seed: int, start_position: int = 0) -> tf.data.Dataset:
    """Endless stream of 0..size-1, reshuffled every epoch, starting at `start_position`."""
    first_epoch, offset = divmod(start_position, size)
    return (tf.data.Dataset.range(first_epoch, EPOCH_LIMIT)
            .flat_map(lambda e: tf.data.Dataset.from_tensor_slices(epoch_permutation(size, seed, e)))
            .skip(offset))


def normalizer(mean, std):
    """Batch map: uint8 (or float in [0, 255]) images to (x / 255 - mean) / std, float32."""
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)

    def normalize(images, labels):
        return (tf.cast(images, tf.float32) / 255.0 - mean) / std, labels

    return normalize


def finish_train(ds: tf.data.Dataset, batch_size: int, mean, std) -> tf.data.Dataset:
    """Full batches of an endless stream, normalised per batch (cheaper than per image)."""
    return (ds.batch(batch_size, drop_remainder=True)
            .map(normalizer(mean, std), num_parallel_calls=AUTOTUNE)
            .prefetch(AUTOTUNE))


def finish_test(ds: tf.data.Dataset, batch_size: int, mean, std) -> tf.data.Dataset:
    return (ds.batch(batch_size)
            .map(normalizer(mean, std), num_parallel_calls=AUTOTUNE)
            .prefetch(AUTOTUNE))
