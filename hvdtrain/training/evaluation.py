"""The test-split evaluation (at the end of a run, and within epochs), and naming the input a decode error came from."""

from __future__ import annotations

import contextlib
from typing import Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.data import DataSource
from hvdtrain.errors import DataError

EVAL_BATCH = 250


@contextlib.contextmanager
def naming_bad_input(data: DataSource, rank: int, workers: int):
    """Turn a decode failure deep in tf.data into one line naming the file at fault."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as exc:
        problem = data.find_bad_input(rank, workers)
        if problem is None:
            raise
        raise DataError(problem) from exc


class TestEvaluation:
    """Loss and accuracy of `model` over a test split, traced once and reused: the periodic
    evaluations within epochs (`--eval-every`) would otherwise trace again every time."""

    def __init__(self, model: keras.Model):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

        @tf.function(autograph=False)  # no Python control flow to convert
        def batch_totals(images, labels):
            logits = tf.cast(model(images, training=False), tf.float32)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                                                     tf.cast(labels, tf.int32)), tf.float64))
            return tf.stack([tf.cast(loss_fn(labels, logits), tf.float64), correct,
                             tf.cast(tf.shape(labels)[0], tf.float64)])

        self._batch_totals = batch_totals

    def __call__(self, test_ds: tf.data.Dataset, name: str = "evaluation",
                 on_batch: Callable[[], None] | None = None) -> tuple[float, float]:
        """Each worker its shard, summed exactly over workers; a collective call.
        `on_batch` is called after each batch (a watchdog's beat)."""
        local = tf.zeros(3, tf.float64)
        for images, labels in test_ds:
            local += self._batch_totals(images, labels)
            if on_batch is not None:
                on_batch()
        loss_sum, correct, count = comm.total([local], name=name)[0].numpy()
        if count == 0:
            raise DataError("the test split is empty")
        return float(loss_sum / count), float(correct / count)


def evaluate(model: keras.Model, test_ds: tf.data.Dataset,
             on_batch: Callable[[], None] | None = None) -> tuple[float, float]:
    """Loss and accuracy over the whole test split: each worker its shard, summed exactly."""
    return TestEvaluation(model)(test_ds, on_batch=on_batch)


def first_part(test_ds: tf.data.Dataset, examples: int | None, workers: int) -> tf.data.Dataset:
    """A fixed part of a worker's test shard: its first ceil(examples / workers), so the
    workers together evaluate about `examples` (all of the shard when None)."""
    if examples is None:
        return test_ds
    return test_ds.unbatch().take(-(-examples // workers)).batch(EVAL_BATCH)
