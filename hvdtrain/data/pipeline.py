"""tf.data building blocks shared by the readers."""

from __future__ import annotations

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def normalizer(mean, std):
    """Batch map: uint8 (or float in [0, 255]) images to (x / 255 - mean) / std, float32."""
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)

    def normalize(images, labels):
        return (tf.cast(images, tf.float32) / 255.0 - mean) / std, labels

    return normalize


def finish_train(ds: tf.data.Dataset, batch_size: int, mean, std) -> tf.data.Dataset:
    """Repeat, full batches, normalise per batch (cheaper than per image), prefetch."""
    return (ds.repeat()
            .batch(batch_size, drop_remainder=True)
            .map(normalizer(mean, std), num_parallel_calls=AUTOTUNE)
            .prefetch(AUTOTUNE))


def finish_test(ds: tf.data.Dataset, batch_size: int, mean, std) -> tf.data.Dataset:
    return (ds.batch(batch_size)
            .map(normalizer(mean, std), num_parallel_calls=AUTOTUNE)
            .prefetch(AUTOTUNE))
