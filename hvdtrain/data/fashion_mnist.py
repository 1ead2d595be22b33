"""Fashion-MNIST (Xiao et al. 2017) from its IDX files; Debian ships it as dataset-fashion-mnist."""

from __future__ import annotations

import os

from hvdtrain.data.arrays import ArrayDataset
from hvdtrain.data.idx import read_images_and_labels
from hvdtrain.errors import DataError

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_HINT = "install it with: apt-get install -y dataset-fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Pixel statistics of the training split, scaled to [0, 1].
MEAN, STD = (0.2860,), (0.3530,)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise DataError(f"{os.path.join(data_dir, stem)}[.gz]: file not found"
                    + (f"; {INSTALL_HINT}" if data_dir == DEFAULT_DIR else ""))


def load(data_dir: str | None = None) -> ArrayDataset:
    data_dir = data_dir or DEFAULT_DIR
    if not os.path.isdir(data_dir):
        hint = f"; {INSTALL_HINT}" if data_dir == DEFAULT_DIR else ""
        raise DataError(f"{data_dir}: Fashion-MNIST folder not found{hint}")
    splits = {}
    for split, (images, labels) in FILES.items():
        x, y = read_images_and_labels(_find(data_dir, images), _find(data_dir, labels))
        splits[split] = (x[..., None], y.astype("int32"))
    return ArrayDataset("fashion-mnist", *splits["train"], *splits["test"],
                        num_classes=10, mean=MEAN, std=STD)
