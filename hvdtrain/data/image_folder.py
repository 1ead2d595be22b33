"""Image folders: DATA_DIR/train/<class>/<image> and DATA_DIR/val/<class>/<image>.

Class names are the sub-folder names of train/, sorted; their position is the
label. JPEG, PNG, GIF (first frame) and BMP are read. Workers shard the file list,
so each worker opens only its own images.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from hvdtrain.data import images
from hvdtrain.data.pipeline import (AUTOTUNE, finish_test, finish_train, first_missing,
                                    passing_indices, shuffled_indices)
from hvdtrain.data.source import DataSource
from hvdtrain.errors import DataError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
TEST_SPLITS = ("val", "validation", "test")


def list_split(folder: str, classes: list[str] | None = None) -> tuple[list[str], list[int], list[str]]:
    """(paths, labels, class names) of one split, in a stable order."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: image folder not found")
    if classes is None:
        classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
        if not classes:
            raise DataError(f"{folder}: no class sub-folders")
    paths, labels = [], []
    for label, name in enumerate(classes):
        class_dir = os.path.join(folder, name)
        if not os.path.isdir(class_dir):
            continue
        for file in sorted(os.listdir(class_dir)):
            if file.lower().endswith(EXTENSIONS):
                paths.append(os.path.join(class_dir, file))
                labels.append(label)
    if not paths:
        raise DataError(f"{folder}: no images ({', '.join(EXTENSIONS)}) in its class sub-folders")
    return paths, labels, classes


def find_test_split(data_dir: str) -> str:
    for name in TEST_SPLITS:
        if os.path.isdir(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise DataError(f"{data_dir}: no test split (a sub-folder named {' or '.join(TEST_SPLITS)})")


class ImageFolder(DataSource):
    def __init__(self, data_dir: str, image_size: int = 224):
        if not data_dir or not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: image folder not found")
        self.name = "image-folder"
        self.train_paths, self.train_labels, self.classes = list_split(os.path.join(data_dir, "train"))
        self.test_paths, self.test_labels, _ = list_split(find_test_split(data_dir), self.classes)
        self.image_size = image_size
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = len(self.classes)

    @property
    def num_train(self) -> int:
        return len(self.train_paths)

    def shard(self, rank: int, workers: int) -> np.ndarray:
        return np.array(self.train_paths[rank::workers])

    def _files(self, paths, labels, rank, workers):
        return tf.data.Dataset.from_tensor_slices(
            (np.array(paths[rank::workers]), np.array(labels[rank::workers], np.int32)))

    def train(self, rank: int, workers: int, batch_size: int, seed: int,
              start_step: int = 0) -> tf.data.Dataset:
        size = self.image_size
        paths = tf.constant(self.train_paths[rank::workers])
        labels = tf.constant(self.train_labels[rank::workers], tf.int32)
        # One file per image: shuffling indices gives an exact, resumable order.
        ds = (shuffled_indices(len(self.train_paths[rank::workers]), seed + rank,
                               start_step * batch_size)
              .map(lambda i: (images.train_crop(tf.io.read_file(tf.gather(paths, i)), size),
                              tf.gather(labels, i)), num_parallel_calls=AUTOTUNE))
        return finish_train(ds, batch_size, images.IMAGENET_MEAN, images.IMAGENET_STD)

    def test(self, rank: int, workers: int, batch_size: int) -> tf.data.Dataset:
        size = self.image_size
        ds = self._files(self.test_paths, self.test_labels, rank, workers).map(
            lambda p, y: (images.eval_crop(tf.io.read_file(p), size), y),
            num_parallel_calls=AUTOTUNE)
        return finish_test(ds, batch_size, images.IMAGENET_MEAN, images.IMAGENET_STD)

    def find_bad_input(self, rank: int, workers: int) -> str | None:
        paths = self.train_paths[rank::workers] + self.test_paths[rank::workers]
        if not paths:
            return None
        # Every file read and decoded in parallel by tf.data; Python looks at the first failure.
        passed = passing_indices(tf.data.Dataset.from_tensor_slices(paths),
                                 lambda p: tf.size(images.decode(tf.io.read_file(p))) > 0)
        bad = first_missing(passed, len(paths))
        return None if bad is None else _describe_file(paths[bad])


def _describe_file(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            problem = images.check_decodable(fh.read()) or "cannot decode image"
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror})"
    return f"{path}: undecodable image ({problem})"
