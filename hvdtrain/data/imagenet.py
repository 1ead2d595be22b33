"""ImageNet-style TFRecords (the format of tensorflow/models' build_imagenet_data.py).

Shards `train-*` and `validation-*`; each record holds `image/encoded` (JPEG bytes)
and `image/class/label` (1..1000, mapped here to 0..999). Workers shard by file
when there are at least as many files as workers (each worker opens only its
files), otherwise by record before decoding. The number of training records comes
from the folder's manifest.json, or from --train-examples; counting them, a full
pass over the set, is the last resort (`count_train`).
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np
import tensorflow as tf

from hvdtrain.data import images
from hvdtrain.data.manifest import MANIFEST, manifest_path, read_manifest, split_examples
from hvdtrain.data.pipeline import (AUTOTUNE, finish_test, finish_train, first_missing,
                                    passing_indices, shuffled_indices)
from hvdtrain.data.source import DataSource
from hvdtrain.errors import ConfigError, DataError

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
SHUFFLE_BUFFER = 2048
# ImageNet's classes, when the manifest does not name them.
DEFAULT_CLASSES = 1000


def split_files(data_dir: str, prefix: str) -> list[str]:
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


def _records_in(path) -> tf.Tensor:
    return tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda n, _: n + 1)


def records_per_file(files) -> list[int]:
    """Records in each file: a full read of every byte, done by tf.data, files in parallel."""
    files = [str(f) for f in files]
    if not files:
        return []
    counts = tf.data.Dataset.from_tensor_slices(files).map(_records_in, num_parallel_calls=AUTOTUNE)
    try:
        return [int(n) for n in counts.batch(len(files)).get_single_element()]
    except tf.errors.DataLossError:
        # The error does not say which file; look for it one file at a time.
        for path in files:
            readable, sound = _readable_records(path)
            if not sound:
                raise DataError(_truncated(path, readable)) from None
        raise


def count_records(files) -> int:
    return sum(records_per_file(files))


class TFRecordImages(DataSource):
    def __init__(self, data_dir: str, image_size: int = 224, num_classes: int | None = None,
                 name: str = "imagenet"):
        """`num_classes`: by default the manifest's class count, else ImageNet's 1000."""
        if not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: TFRecord folder not found")
        self.name = name
        self.data_dir = data_dir
        self.train_files = split_files(data_dir, "train")
        self.test_files = split_files(data_dir, "validation")
        self.image_size = image_size
        self.input_shape = (image_size, image_size, 3)
        manifest = read_manifest(data_dir)
        # What the manifest says the files hold; None when there is no manifest.
        self.listed_train = (None if manifest is None else
                             split_examples(manifest, data_dir, "train", self.train_files))
        classes = manifest["classes"] if manifest else None
        self.num_classes = num_classes or (len(classes) if classes else DEFAULT_CLASSES)
        self._num_train = self.listed_train

    @property
    def size_is_cheap(self) -> bool:
        return self._num_train is not None

    @property
    def num_train(self) -> int:
        if self._num_train is None:
            raise DataError(
                f"{self.data_dir}: the number of training records is unknown (no {MANIFEST}): "
                f"pass --train-examples N, or run `hvdtrain data manifest {self.data_dir}` once")
        return self._num_train

    def limit_train(self, count: int) -> "TFRecordImages":
        """Take `count` as the number of training records: the length of an epoch.

        No record is dropped or read: the files are streamed as before, and an epoch
        ends after `count` examples of that stream.
        """
        if self.listed_train is not None and count > self.listed_train:
            raise ConfigError(f"--train-examples {count} is more than the {self.listed_train} "
                              f"training records {manifest_path(self.data_dir)} lists")
        self._num_train = count
        return self

    def count_train(self) -> int:
        if self._num_train is not None:
            return self._num_train
        print(f"hvdtrain: warning: {self.data_dir} has no {MANIFEST}, so every training record "
              f"is read to count them before step 1; avoid this with `hvdtrain data manifest "
              f"{self.data_dir}` (once) or --train-examples N", file=sys.stderr, flush=True)
        return count_records(self.train_files)

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
        # The file order changes with each full pass over the files, however long an epoch is.
        records = self.listed_train or self._num_train
        if start_step and records:
            start_epoch = start_step * batch_size * workers // records
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
    """The first unreadable record of one file, described with the file name.

    Every record is parsed, its label checked and its image decoded by a parallel
    tf.data pipeline; Python then looks only at the first record that failed.
    """
    readable, sound = _readable_records(path)
    records = tf.data.TFRecordDataset(path).take(readable)
    bad = first_missing(passing_indices(records, lambda r: _sound(r, num_classes)), readable)
    if bad is not None:
        return _describe_record(path, bad, num_classes)
    return None if sound else _truncated(path, readable)


def _truncated(path: str, readable: int) -> str:
    return f"{path}: corrupt or truncated TFRecord file after record {readable - 1}"


def _readable_records(path: str) -> tuple[int, bool]:
    """Records that can be read, and whether the file reads to its end without error."""
    try:
        return int(_records_in(path)), True
    except tf.errors.DataLossError:
        # ignore_errors ends the stream at the first corrupt byte: what came before counts.
        ds = tf.data.TFRecordDataset(path).ignore_errors()
        return int(ds.reduce(np.int64(0), lambda n, _: n + 1)), False


def _sound(record, num_classes: int) -> tf.Tensor:
    """True for a record that parses, has a label in range and an image that decodes."""
    encoded, label = _parse(record)
    return tf.logical_and(tf.logical_and(label >= 0, label < num_classes),
                          tf.size(images.decode(encoded)) > 0)


def _describe_record(path: str, index: int, num_classes: int) -> str:
    """What is wrong with record `index`, which failed the checks."""
    record = tf.data.TFRecordDataset(path).skip(index).take(1).get_single_element()
    try:
        encoded, label = _parse(record)
    except tf.errors.InvalidArgumentError:
        return f"{path}: record {index} is not an image example (missing or bad features)"
    if not 0 <= int(label) < num_classes:
        return f"{path}: record {index} has label {int(label) + 1}, expected 1..{num_classes}"
    problem = images.check_decodable(encoded.numpy()) or "cannot decode image"
    return f"{path}: record {index} holds an undecodable image ({problem})"
