"""Convert an image folder into ImageNet-style sharded TFRecords (`hvdtrain data to-tfrecords`),
and describe a TFRecord folder in its manifest.json (`hvdtrain data manifest`)."""

from __future__ import annotations

import os
import random

import tensorflow as tf

from hvdtrain.data import images
from hvdtrain.data.image_folder import find_test_split, list_split
from hvdtrain.data.imagenet import records_per_file, split_files
from hvdtrain.data.manifest import manifest_path, read_manifest, write_manifest
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
                seed: int = 0) -> dict[str, int]:
    """Write `prefix-0000i-of-0000n` files; the order is shuffled so every shard mixes classes.

    Returns the records in each file, by file name.
    """
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    records = {}
    for shard in range(shards):
        name = f"{prefix}-{shard:05d}-of-{shards:05d}"
        members = order[shard::shards]

        def write(tmp, members=members):
            with tf.io.TFRecordWriter(tmp) as writer:
                for i in members:
                    writer.write(image_example(paths[i], labels[i], classes[labels[i]])
                                 .SerializeToString())

        atomic_write(os.path.join(out_dir, name), write)
        records[name] = len(members)
    return records


def convert(src: str, dst: str, train_shards: int = 8, test_shards: int = 2) -> dict[str, int]:
    if not os.path.isdir(src):
        raise DataError(f"{src}: image folder not found")
    train_paths, train_labels, classes = list_split(os.path.join(src, "train"))
    test_paths, test_labels, _ = list_split(find_test_split(src), classes)
    os.makedirs(dst, exist_ok=True)
    # Until the new one is written, an earlier conversion's manifest would describe these files.
    if os.path.exists(manifest_path(dst)):
        os.remove(manifest_path(dst))
    records = {
        "train": write_split(train_paths, train_labels, classes, dst, "train",
                             min(train_shards, len(train_paths))),
        "validation": write_split(test_paths, test_labels, classes, dst, "validation",
                                  min(test_shards, len(test_paths))),
    }
    # Written last: a folder with a manifest holds a finished conversion.
    write_manifest(dst, records, classes)
    return {"train": len(train_paths), "validation": len(test_paths), "classes": len(classes)}


def write_manifest_of(data_dir: str) -> dict:
    """`hvdtrain data manifest`: count the records of a TFRecord folder made elsewhere, once."""
    if not os.path.isdir(data_dir):
        raise DataError(f"{data_dir}: TFRecord folder not found")
    records = {}
    for split in ("train", "validation"):
        files = split_files(data_dir, split)
        records[split] = dict(zip((os.path.basename(f) for f in files), records_per_file(files)))
    try:
        old = read_manifest(data_dir)
    except DataError:
        old = None  # being replaced
    # The records do not name their classes; keep the names a conversion wrote.
    path = write_manifest(data_dir, records, old["classes"] if old else None)
    return {"train": sum(records["train"].values()),
            "validation": sum(records["validation"].values()), "path": path}
