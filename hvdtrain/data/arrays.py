"""Datasets small enough to hold in memory (Fashion-MNIST, CIFAR-10, synthetic)."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # Set by `keep_shard`: (rank, workers, training examples in all shards).
    held: tuple[int, int, int] | None = field(default=None, repr=False)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    @property
    def num_train(self) -> int:
        return self.held[2] if self.held else len(self.train_labels)

    def keep_shard(self, rank: int, workers: int) -> None:
        """Hold only the examples of worker `rank` of `workers`, in both splits, and let
        the rest go: every worker loaded the whole set, which 32 workers on one machine
        would hold 32 times over. Sizes and shards are still those of the whole set."""
        if self.held:
            raise ValueError(f"{self.name} holds one shard already: {self.held[:2]}")
        total = self.num_train
        self.train_images, self.train_labels = _rows(self.train_images, self.train_labels,
                                                     rank, workers)
        self.test_images, self.test_labels = _rows(self.test_images, self.test_labels,
                                                   rank, workers)
        self.held = (rank, workers, total)

    def _own(self, images: np.ndarray, labels: np.ndarray, rank: int,
             workers: int) -> tuple[np.ndarray, np.ndarray]:
        """Worker `rank`'s rows of a split: all that is held once `keep_shard` ran."""
        if self.held is None:
            return _rows(images, labels, rank, workers)
        if self.held[:2] != (rank, workers):
            raise ValueError(f"{self.name} holds worker {self.held[0]} of {self.held[1]}'s "
                             f"shard only, not worker {rank} of {workers}'s")
        return images, labels

    def limit_train(self, count: int) -> "ArrayDataset":
        """Keep the first `count` training examples."""
        if self.held:
            raise ValueError(f"--train-examples must apply before {self.name} is sharded")
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
        images, labels = (tf.constant(rows) for rows in self._own(
            self.train_images, self.train_labels, rank, workers))
        ds = shuffled_indices(len(labels), seed + rank, start_step * batch_size).map(
            lambda i: (tf.gather(images, i), tf.gather(labels, i)), num_parallel_calls=AUTOTUNE)
        if self.augment is not None:
            augment = self.augment
            ds = ds.map(lambda x, y: (augment(x), y), num_parallel_calls=AUTOTUNE)
        return finish_train(ds, batch_size, self.mean, self.std)

    def test(self, rank: int, workers: int, batch_size: int) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(
            self._own(self.test_images, self.test_labels, rank, workers))
        return finish_test(ds, batch_size, self.mean, self.std)


def _rows(images: np.ndarray, labels: np.ndarray, rank: int,
          workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker `rank`'s rows of (images, labels), copied: a whole set they were taken from
    can then be let go."""
    index = shard_indices(len(labels), rank, workers)
    return images[index], labels[index]
