"""Datasets small enough to hold in memory (Fashion-MNIST, CIFAR-10, synthetic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from hvdtrain.data.pipeline import AUTOTUNE, finish_test, finish_train, shuffled_indices
from hvdtrain.data.source import DataSource
from hvdtrain.errors import ConfigError

Augment = Callable[[tf.Tensor], tf.Tensor]


def shard_indices(num_examples: int, rank: int, workers: int) -> np.ndarray:
    """The examples worker `rank` reads: every `workers`-th one, disjoint across workers."""
    return np.arange(rank, num_examples, workers)


def steps_per_epoch(num_examples: int, workers: int, batch_size: int,
                    cap: int | None = None) -> int:
    """Full batches per epoch that every worker can take from its shard.

    Every worker must run the same number of steps, or the allreduce of the
    worker with more would wait forever; the smallest shard decides.
    """
    smallest_shard = num_examples // workers
    steps = smallest_shard // batch_size
    if steps == 0:
        raise ConfigError(
            f"--batch-size {batch_size} is larger than each worker's shard "
            f"({smallest_shard} examples: {num_examples} split over {workers} workers)")
    return min(steps, cap) if cap else steps


@dataclass
class ArrayDataset(DataSource):
    """uint8 images (N, H, W, C) and integer labels, for a train and a test split."""

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    # Per-channel mean and std of the pixel values scaled to [0, 1].
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Applied to each uint8 training image before batching.
    augment: Optional[Augment] = None
    endless: bool = False

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    @property
    def num_train(self) -> int:
        return len(self.train_labels)

    def limit_train(self, count: int) -> "ArrayDataset":
        """Keep the first `count` training examples."""
        if count > self.num_train:
            raise ConfigError(f"--train-examples {count} is more than the {self.num_train} "
                              f"training examples of {self.name}")
        self.train_images = self.train_images[:count]
        self.train_labels = self.train_labels[:count]
        return self

    def shard(self, rank: int, workers: int) -> np.ndarray:
        return shard_indices(self.num_train, rank, workers)

    def train(self, rank: int, workers: int, batch_size: int, seed: int,
              start_step: int = 0) -> tf.data.Dataset:
        """This worker's shard, reshuffled every epoch, from example `start_step * batch_size`.

        Shuffling indices rather than images makes resuming cheap: skipping is done on
        integers. The uint8 images stay uint8 until a whole batch is normalised.
        """
        index = self.shard(rank, workers)
        images = tf.constant(self.train_images[index])
        labels = tf.constant(self.train_labels[index])
        ds = shuffled_indices(len(index), seed + rank, start_step * batch_size).map(
            lambda i: (tf.gather(images, i), tf.gather(labels, i)), num_parallel_calls=AUTOTUNE)
        if self.augment is not None:
            augment = self.augment
            ds = ds.map(lambda x, y: (augment(x), y), num_parallel_calls=AUTOTUNE)
        return finish_train(ds, batch_size, self.mean, self.std)

    def test(self, rank: int, workers: int, batch_size: int) -> tf.data.Dataset:
        index = shard_indices(len(self.test_labels), rank, workers)
        ds = tf.data.Dataset.from_tensor_slices((self.test_images[index], self.test_labels[index]))
        return finish_test(ds, batch_size, self.mean, self.std)
