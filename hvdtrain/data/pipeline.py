"""tf.data building blocks shared by the readers."""

from __future__ import annotations

import numpy as np
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


# --- finding the input that broke a pipeline ---

def passing_indices(items: tf.data.Dataset, check) -> np.ndarray:
    """Positions (in any order) of the elements of `items` that pass `check`.

    `check(element)` returns a scalar bool; an element fails when it is False or when
    computing it raises an error (an undecodable image), and everything after an error
    in `items` itself is left out (a corrupt file ends the stream). The checks run in
    parallel in tf.data's threads, not record by record in Python. What a check
    computes must feed its result: tf.data prunes work that no output depends on.
    """
    passed = (items.enumerate()
              .map(lambda i, x: (i, check(x)), num_parallel_calls=AUTOTUNE, deterministic=False)
              .ignore_errors()
              .filter(lambda i, ok: ok)
              .map(lambda i, ok: i)
              .batch(1 << 16))
    return np.concatenate([b.numpy() for b in passed] + [np.zeros(0, np.int64)])


def first_missing(indices: np.ndarray, count: int) -> int | None:
    """The smallest of 0..count-1 that is not in `indices`, or None."""
    missing = np.setdiff1d(np.arange(count), indices)
    return int(missing[0]) if missing.size else None
