"""Convert an image folder into ImageNet-style sharded TFRecords (`hvdtrain data to-tfrecords`)."""

from __future__ import annotations

import os
import random

import tensorflow as tf

from hvdtrain.data import images
from hvdtrain.data.image_folder import find_test_split, list_split
from hvdtrain.errors import DataError
from hvdtrain.files import atomic_write


def _bytes(value: bytes):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def image_example(path: str, label: int, synset: str) -> tf.train.Example:
    """One record: JPEG bytes (re-encoded when the file is not JPEG), label counted from 1."""
    with open(path, "rb") as fh:
        encoded = fh.read()
    problem = images.check_decodable(encoded)
    if problem:
        raise DataError(f"{path}: undecodable image ({problem})")
    image = images.decode(tf.constant(encoded))
    if not tf.io.is_jpeg(encoded):
        encoded = tf.io.encode_jpeg(image, quality=95).numpy()
    height, width = int(image.shape[0]), int(image.shape[1])
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(encoded),
        "image/format": _bytes(b"JPEG"),
        "image/class/label": _int(label + 1),
        "image/class/synset": _bytes(synset.encode()),
        "image/filename": _bytes(os.path.basename(path).encode()),
        "image/height": _int(height),
        "image/width": _int(width),
        "image/channels": _int(3),
        "image/colorspace": _bytes(b"RGB"),
    }))


def write_split(paths, labels, classes, out_dir: str, prefix: str, shards: int,
                seed: int = 0) -> list[str]:
    """Write `prefix-0000i-of-0000n` files; the order is shuffled so every shard mixes classes."""
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    names = []
    for shard in range(shards):
        name = os.path.join(out_dir, f"{prefix}-{shard:05d}-of-{shards:05d}")

        def write(tmp, members=order[shard::shards]):
            with tf.io.TFRecordWriter(tmp) as writer:
                for i in members:
                    writer.write(image_example(paths[i], labels[i], classes[labels[i]])
                                 .SerializeToString())

        atomic_write(name, write)
        names.append(name)
    return names


def convert(src: str, dst: str, train_shards: int = 8, test_shards: int = 2) -> dict[str, int]:
    if not os.path.isdir(src):
        raise DataError(f"{src}: image folder not found")
    train_paths, train_labels, classes = list_split(os.path.join(src, "train"))
    test_paths, test_labels, _ = list_split(find_test_split(src), classes)
    os.makedirs(dst, exist_ok=True)
    write_split(train_paths, train_labels, classes, dst, "train", min(train_shards, len(train_paths)))
    write_split(test_paths, test_labels, classes, dst, "validation", min(test_shards, len(test_paths)))
    return {"train": len(train_paths), "validation": len(test_paths), "classes": len(classes)}
