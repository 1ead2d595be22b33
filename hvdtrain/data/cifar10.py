"""CIFAR-10 in its binary format, with the standard augmentation (pad 4, random crop, flip).

Files `data_batch_1.bin` .. `data_batch_5.bin` and `test_batch.bin` (in DATA_DIR or
DATA_DIR/cifar-10-batches-bin); each record is 1 label byte and 3072 pixel bytes,
channel-major (1024 R, 1024 G, 1024 B, each 32x32 row-major).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from hvdtrain.data.arrays import ArrayDataset
from hvdtrain.errors import DataError

SIDE, CHANNELS = 32, 3
RECORD_BYTES = 1 + SIDE * SIDE * CHANNELS
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def read_batch_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) uint8 and labels (N,) int32 from one binary batch file."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise DataError(f"{path}: not a CIFAR-10 batch: {raw.size} bytes is not a positive "
                        f"multiple of the {RECORD_BYTES}-byte record (truncated?)")
    records = raw.reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int32)
    if labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise DataError(f"{path}: record {bad} has label {labels[bad]}, expected 0..9")
    images = records[:, 1:].reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def _folder(data_dir: str) -> str:
    nested = os.path.join(data_dir, "cifar-10-batches-bin")
    return nested if os.path.isdir(nested) else data_dir


def _read(folder: str, names) -> tuple[np.ndarray, np.ndarray]:
    parts = []
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise DataError(f"{path}: file not found")
        parts.append(read_batch_file(path))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def augment(image: tf.Tensor) -> tf.Tensor:
    padded = tf.pad(image, [[4, 4], [4, 4], [0, 0]])
    return tf.image.random_flip_left_right(tf.image.random_crop(padded, [SIDE, SIDE, CHANNELS]))


def load(data_dir: str | None) -> ArrayDataset:
    if not data_dir:
        raise DataError("cifar10 needs --data-dir: the folder of data_batch_*.bin and test_batch.bin")
    if not os.path.isdir(data_dir):
        raise DataError(f"{data_dir}: CIFAR-10 folder not found")
    folder = _folder(data_dir)
    train = _read(folder, TRAIN_FILES)
    test = _read(folder, TEST_FILES)
    return ArrayDataset("cifar10", *train, *test, num_classes=10, mean=MEAN, std=STD,
                        augment=augment)
