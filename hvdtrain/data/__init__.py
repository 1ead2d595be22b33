"""Datasets by name. Every reader works from local files only."""

from __future__ import annotations

from hvdtrain.data.arrays import ArrayDataset, shard_indices, steps_per_epoch
from hvdtrain.errors import ConfigError

DATASETS = ("fashion-mnist", "synthetic")


def load_dataset(name: str, data_dir: str | None = None, synthetic_shape=(28, 28, 1),
                 seed: int = 0) -> ArrayDataset:
    if name == "fashion-mnist":
        from hvdtrain.data import fashion_mnist
        return fashion_mnist.load(data_dir)
    if name == "synthetic":
        from hvdtrain.data import synthetic
        return synthetic.load(tuple(synthetic_shape), seed=seed)
    raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}, got {name!r}")


__all__ = ["ArrayDataset", "DATASETS", "load_dataset", "shard_indices", "steps_per_epoch"]
