"""Random images and labels of any shape, held in memory: measures the model, not the disk."""

from __future__ import annotations

import numpy as np

from hvdtrain.data.arrays import ArrayDataset

TRAIN_EXAMPLES = 4096
TEST_EXAMPLES = 512


def load(shape: tuple[int, int, int], num_classes: int = 10, seed: int = 0,
         train_examples: int = TRAIN_EXAMPLES) -> ArrayDataset:
    rng = np.random.default_rng(seed)

    def split(n):
        return (rng.integers(0, 256, size=(n, *shape), dtype=np.uint8),
                rng.integers(0, num_classes, size=(n,), dtype=np.int32))

    return ArrayDataset("synthetic", *split(train_examples), *split(TEST_EXAMPLES),
                        num_classes=num_classes, mean=(0.5,) * shape[-1],
                        std=(0.29,) * shape[-1], endless=True)
