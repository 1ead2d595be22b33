"""Datasets by name. Every reader works from local files only."""

from __future__ import annotations

from hvdtrain.config import DATASETS
from hvdtrain.data.arrays import ArrayDataset, shard_indices, steps_per_epoch
from hvdtrain.data.source import DataSource
from hvdtrain.errors import ConfigError


def load_dataset(name: str, data_dir: str | None = None, synthetic_shape=(28, 28, 1),
                 seed: int = 0, image_size: int = 224) -> DataSource:
    if name == "fashion-mnist":
        from hvdtrain.data import fashion_mnist
        return fashion_mnist.load(data_dir)
    if name == "cifar10":
        from hvdtrain.data import cifar10
        return cifar10.load(data_dir)
    if name == "imagenet":
        from hvdtrain.data.imagenet import TFRecordImages
        if not data_dir:
            raise ConfigError("--dataset imagenet needs --data-dir: the folder of train-* and "
                              "validation-* TFRecord files")
        return TFRecordImages(data_dir, image_size)
    if name == "image-folder":
        from hvdtrain.data.image_folder import ImageFolder
        if not data_dir:
            raise ConfigError("--dataset image-folder needs --data-dir: a folder with train/ and val/")
        return ImageFolder(data_dir, image_size)
    if name == "synthetic":
        from hvdtrain.data import synthetic
        return synthetic.load(tuple(synthetic_shape), seed=seed)
    if name == "synthetic-device":
        from hvdtrain.data import device_synthetic
        return device_synthetic.load(tuple(synthetic_shape), seed=seed)
    raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}, got {name!r}")


__all__ = ["ArrayDataset", "DataSource", "DATASETS", "load_dataset", "shard_indices",
           "steps_per_epoch"]
