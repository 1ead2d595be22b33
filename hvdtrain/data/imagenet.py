"""ImageNet-style TFRecords (the format of tensorflow/models' build_imagenet_data.py).

Shards `train-*` and `validation-*`; each record holds `image/encoded` (JPEG bytes)
and `image/class/label` (1..1000, mapped here to 0..999). Workers shard by file
when there are at least as many files as workers (each worker opens only its
files), otherwise by record before decoding.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.data import images
from hvdtrain.data.pipeline import AUTOTUNE, finish_test, finish_train, shuffled_indices
from hvdtrain.data.source import DataSource
from hvdtrain.errors import DataError

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
SHUFFLE_BUFFER = 2048


def _files(data_dir: str, prefix: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(data_dir, f"{prefix}-*")))
    if not files:
        raise DataError(f"{data_dir}: no files matching {prefix}-*")
    return files


def _parse(record):
    features = tf.io.parse_single_example(record, FEATURES)
    return features["image/encoded"], tf.cast(features["image/class/label"] - 1, tf.int32)


def shard_files(files: list[str], rank: int, workers: int) -> list[str] | None:
    """This worker's files, or None when there are too few files to split."""
    return files[rank::workers] if len(files) >= workers else None


def count_records(files) -> int:
    return sum(1 for path in files for _ in tf.data.TFRecordDataset(path))


class TFRecordImages(DataSource):
    def __init__(self, data_dir: str, image_size: int = 224, num_classes: int = 1000,
                 name: str = "imagenet"):
        if not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: TFRecord folder not found")
        self.name = name
        self.train_files = _files(data_dir, "train")
        self.test_files = _files(data_dir, "validation")
        self.image_size = image_size
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes
        self._num_train: int | None = None

    @property
    def size_is_cheap(self) -> bool:
        return False

    @property
    def num_train(self) -> int:
        """Counted once, each worker reading a share of the files (a collective call)."""
        if self._num_train is None and not comm.is_initialized():
            self._num_train = count_records(self.train_files)
        elif self._num_train is None:
            mine = self.train_files[comm.rank()::comm.size()]
            (total,) = comm.total([tf.constant([count_records(mine)], tf.int64)], name="count")
            self._num_train = int(total.numpy()[0])
        return self._num_train

    def shard(self, rank: int, workers: int) -> np.ndarray:
        return np.array(shard_files(self.train_files, rank, workers) or self.train_files)

    def _records(self, files: list[str], rank: int, workers: int, seed: int | None,
                 start_epoch: int = 0):
        mine = shard_files(files, rank, workers)
        if mine is None:
            records = tf.data.TFRecordDataset(files).shard(workers, rank)
            return records if seed is None else records.repeat()
        if seed is None:
            return tf.data.TFRecordDataset(mine)
        # Each epoch reads the files in an order fixed by (seed, epoch), so a resumed run
        # picks up the file order of the epoch it stopped in.
        names = tf.constant(mine)
        order = shuffled_indices(len(mine), seed + rank, start_epoch * len(mine))
        return order.interleave(lambda i: tf.data.TFRecordDataset(tf.gather(names, i)),
                                cycle_length=min(len(mine), 8), num_parallel_calls=AUTOTUNE,
                                deterministic=False)

    def train(self, rank: int, workers: int, batch_size: int, seed: int,
              start_step: int = 0) -> tf.data.Dataset:
        size = self.image_size
        start_epoch = 0
        if start_step and self._num_train:
            start_epoch = start_step * batch_size * workers // self._num_train
        ds = (self._records(self.train_files, rank, workers, seed, start_epoch)
              .shuffle(SHUFFLE_BUFFER, seed=seed + rank, reshuffle_each_iteration=True)
              .map(lambda r: _decoded(r, lambda e: images.train_crop(e, size)),
                   num_parallel_calls=AUTOTUNE))
        return finish_train(ds, batch_size, images.IMAGENET_MEAN, images.IMAGENET_STD)

    def test(self, rank: int, workers: int, batch_size: int) -> tf.data.Dataset:
        size = self.image_size
        ds = self._records(self.test_files, rank, workers, None).map(
            lambda r: _decoded(r, lambda e: images.eval_crop(e, size)), num_parallel_calls=AUTOTUNE)
        return finish_test(ds, batch_size, images.IMAGENET_MEAN, images.IMAGENET_STD)

    def find_bad_input(self, rank: int, workers: int) -> str | None:
        files = self.train_files + self.test_files
        for path in shard_files(files, rank, workers) or files:
            problem = find_bad_record(path, self.num_classes)
            if problem:
                return problem
        return None


def _decoded(record, crop):
    encoded, label = _parse(record)
    return crop(encoded), label


def find_bad_record(path: str, num_classes: int) -> str | None:
    """The first unreadable record of one file, described with the file name."""
    index = -1
    try:
        for index, record in enumerate(tf.data.TFRecordDataset(path)):
            try:
                encoded, label = _parse(record)
            except tf.errors.InvalidArgumentError:
                return f"{path}: record {index} is not an image example (missing or bad features)"
            if not 0 <= int(label) < num_classes:
                return f"{path}: record {index} has label {int(label) + 1}, expected 1..{num_classes}"
            problem = images.check_decodable(encoded.numpy())
            if problem:
                return f"{path}: record {index} holds an undecodable image ({problem})"
    except tf.errors.DataLossError:
        return f"{path}: corrupt or truncated TFRecord file after record {index}"
    return None
