"""In-memory image classification data and how it is split across workers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hvdtrain.errors import ConfigError


@dataclass
class ArrayDataset:
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

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    def take_train(self, count: int | None) -> "ArrayDataset":
        if count is None:
            return self
        self.train_images = self.train_images[:count]
        self.train_labels = self.train_labels[:count]
        return self


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
