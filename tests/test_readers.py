"""The file readers: CIFAR-10 binary, ImageNet-style TFRecords, image folders, the converter."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import write_image_folder
from hvdtrain.data import cifar10, load_dataset
from hvdtrain.data.image_folder import ImageFolder
from hvdtrain.data.imagenet import (TFRecordImages, count_records, find_bad_record,
                                    records_per_file, shard_files)
from hvdtrain.data.manifest import MANIFEST, make_manifest
from hvdtrain.data.to_tfrecords import convert, write_manifest_of
from hvdtrain.files import read_json, write_json
from hvdtrain.errors import ConfigError, DataError


# --- CIFAR-10 ---

def _write_cifar_batch(path, images, labels):
    """The inverse of cifar10.read_batch_file: label byte, then the channel-major pixels."""
    pixels = np.asarray(images, np.uint8).transpose(0, 3, 1, 2).reshape(len(images), -1)
    np.concatenate([np.asarray(labels, np.uint8)[:, None], pixels], axis=1).tofile(path)


def _cifar_dir(tmp_path, per_file=6):
    rng = np.random.default_rng(0)
    for name in (*cifar10.TRAIN_FILES, *cifar10.TEST_FILES):
        images = rng.integers(0, 256, size=(per_file, 32, 32, 3), dtype=np.uint8)
        _write_cifar_batch(str(tmp_path / name), images, rng.integers(0, 10, per_file))
    return tmp_path


def test_cifar_records_are_channel_major_label_then_pixels(tmp_path):
    record = np.zeros(cifar10.RECORD_BYTES, np.uint8)
    record[0] = 7
    record[1:1025] = 10          # red plane
    record[1025:2049] = 20       # green plane
    record[2049 + 32] = 99       # blue, row 1, column 0
    path = tmp_path / "one.bin"
    record.tofile(path)
    images, labels = cifar10.read_batch_file(str(path))
    assert labels.tolist() == [7] and images.shape == (1, 32, 32, 3)
    assert images[0, 0, 0].tolist() == [10, 20, 0] and images[0, 1, 0, 2] == 99


def test_cifar_loads_all_batches_and_augments_to_the_same_shape(tmp_path):
    data = cifar10.load(str(_cifar_dir(tmp_path)))
    assert data.num_train == 30 and len(data.test_labels) == 6 and data.input_shape == (32, 32, 3)
    images, labels = next(iter(data.train(rank=0, workers=2, batch_size=5, seed=1)))
    assert images.shape == (5, 32, 32, 3) and images.dtype == tf.float32
    lo = min((0 - m) / s for m, s in zip(cifar10.MEAN, cifar10.STD))
    hi = max((1 - m) / s for m, s in zip(cifar10.MEAN, cifar10.STD))
    assert lo - 1e-5 <= images.numpy().min() and images.numpy().max() <= hi + 1e-5
    crop = cifar10.augment(tf.constant(np.full((32, 32, 3), 200, np.uint8)))
    # A crop from the zero-padded image: same shape, padding shows as zeros somewhere or nowhere.
    assert crop.shape == (32, 32, 3) and set(np.unique(crop.numpy())) <= {0, 200}


def test_cifar_bad_files_are_named(tmp_path):
    folder = _cifar_dir(tmp_path)
    bad = folder / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-10])
    with pytest.raises(DataError, match=f"{bad}: not a CIFAR-10 batch: .* multiple of the 3073-byte record"):
        cifar10.load(str(folder))
    os.remove(bad)
    with pytest.raises(DataError, match=f"{bad}: file not found"):
        cifar10.load(str(folder))
    record = np.zeros(cifar10.RECORD_BYTES, np.uint8)
    record[0] = 12
    record.tofile(bad)
    with pytest.raises(DataError, match="record 0 has label 12, expected 0..9"):
        cifar10.load(str(folder))
    with pytest.raises(DataError, match="cifar10 needs --data-dir"):
        cifar10.load(None)


# --- image folders and TFRecords ---

@pytest.fixture(scope="module")
def image_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    folder = write_image_folder(str(root / "folder"))
    counts = convert(folder, str(root / "tfrecords"), train_shards=4, test_shards=2)
    return folder, str(root / "tfrecords"), counts


def test_converter_writes_sharded_tfrecords_in_the_imagenet_format(image_tree):
    _, records, counts = image_tree
    assert counts == {"train": 18, "validation": 6, "classes": 3}
    assert sorted(os.listdir(records)) == ["manifest.json"] + [
        f"train-0000{i}-of-00004" for i in range(4)] + [
        "validation-00000-of-00002", "validation-00001-of-00002"]
    raw = next(iter(tf.data.TFRecordDataset(os.path.join(records, "train-00000-of-00004"))))
    example = tf.train.Example.FromString(raw.numpy()).features.feature
    assert example["image/format"].bytes_list.value == [b"JPEG"]
    assert 1 <= example["image/class/label"].int64_list.value[0] <= 3
    assert example["image/class/synset"].bytes_list.value[0].startswith(b"class_")
    assert tf.io.is_jpeg(example["image/encoded"].bytes_list.value[0])  # PNGs were re-encoded


def test_tfrecord_reader_maps_labels_to_zero_based_and_crops(image_tree):
    _, records, _ = image_tree
    data = TFRecordImages(records, image_size=40, num_classes=3)
    assert data.num_train == 18 and data.input_shape == (40, 40, 3)
    images, labels = next(iter(data.train(0, 1, batch_size=6, seed=0)))
    assert images.shape == (6, 40, 40, 3) and set(labels.numpy().tolist()) <= {0, 1, 2}
    test = np.concatenate([y.numpy() for _, y in data.test(0, 1, batch_size=4)])
    assert sorted(test.tolist()) == [0, 0, 1, 1, 2, 2]


def test_two_workers_read_disjoint_shards_that_cover_the_data(image_tree):
    folder, records, _ = image_tree
    data = TFRecordImages(records, image_size=32, num_classes=3)
    files0, files1 = data.shard(0, 2), data.shard(1, 2)
    assert not set(files0) & set(files1) and len(files0) + len(files1) == 4
    assert count_records(files0) + count_records(files1) == 18
    # Fewer files than workers: records are split instead, still disjoint and complete.
    assert shard_files(["a"], 1, 2) is None
    labels = [np.concatenate([y.numpy() for _, y in data.test(r, 3, batch_size=2)]) for r in range(3)]
    assert sorted(np.concatenate(labels).tolist()) == [0, 0, 1, 1, 2, 2]
    folder_data = ImageFolder(folder, image_size=32)
    paths = [set(folder_data.shard(r, 2).tolist()) for r in range(2)]
    assert not paths[0] & paths[1] and len(paths[0] | paths[1]) == 18


def _copy_records(records, tmp_path, manifest=True):
    copy = tmp_path / "records"
    shutil.copytree(records, copy)
    if not manifest:
        os.remove(copy / MANIFEST)
    return copy


def test_converter_manifest_gives_the_size_without_reading_a_record(image_tree, tmp_path):
    _, records, _ = image_tree
    manifest = read_json(os.path.join(records, MANIFEST))
    assert manifest["splits"]["train"]["examples"] == 18
    assert manifest["splits"]["validation"]["files"] == {
        "validation-00000-of-00002": 3, "validation-00001-of-00002": 3}
    assert manifest["classes"] == ["class_00", "class_01", "class_02"]
    copy = _copy_records(records, tmp_path)
    for name in os.listdir(copy):
        if name.startswith("train-"):
            (copy / name).write_bytes(b"")  # reading any record now would fail or find none
    data = TFRecordImages(str(copy), image_size=32)
    assert data.size_is_cheap and data.num_train == 18 == data.count_train()
    assert data.num_classes == 3  # from the manifest's classes


def test_a_manifest_that_does_not_match_the_files_is_refused_in_one_line(image_tree, tmp_path):
    _, records, _ = image_tree
    copy = _copy_records(records, tmp_path)
    (copy / "train-extra").write_bytes(b"")
    with pytest.raises(DataError, match=f"^{copy}/{MANIFEST}: lists 4 train files but the folder "
                                        "holds 5 \\(train-extra is not listed\\)"):
        TFRecordImages(str(copy))
    write_json(str(copy / MANIFEST), {"format": 1, "splits": {"train": {"files": {"a": 1}}}})
    with pytest.raises(DataError, match="not an hvdtrain manifest .*\"examples\" is not the sum"):
        TFRecordImages(str(copy))


def test_without_manifest_the_size_is_counted_only_on_request_with_a_warning(image_tree, tmp_path,
                                                                              capsys):
    _, records, _ = image_tree
    data = TFRecordImages(str(_copy_records(records, tmp_path, manifest=False)), num_classes=3)
    assert not data.size_is_cheap
    with pytest.raises(DataError, match="number of training records is unknown .*--train-examples"):
        data.num_train
    assert data.count_train() == 18
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "every training record is read" in warning[0]
    assert "hvdtrain data manifest" in warning[0] and "--train-examples" in warning[0]
    assert data.limit_train(18) is data and data.size_is_cheap and data.num_train == 18


def test_train_examples_is_the_epoch_length_of_tfrecords_and_a_prefix_of_arrays(image_tree):
    folder, records, _ = image_tree
    data = TFRecordImages(records, num_classes=3)
    assert data.limit_train(10).num_train == 10 and data.listed_train == 18
    with pytest.raises(ConfigError, match="--train-examples 19 is more than the 18 training "
                                          "records .*manifest.json lists"):
        data.limit_train(19)
    arrays = load_dataset("synthetic", synthetic_shape=(4, 4, 1))
    first = arrays.train_images[:7].copy()
    assert arrays.limit_train(7).num_train == 7
    np.testing.assert_array_equal(arrays.train_images, first)
    with pytest.raises(ConfigError, match="--train-examples 8 is more than the 7 training examples"):
        arrays.limit_train(8)
    with pytest.raises(ConfigError, match="^--train-examples does not apply to --dataset "
                                          "image-folder, got --train-examples 5$"):
        ImageFolder(folder, image_size=32).limit_train(5)


def test_manifest_command_counts_tfrecords_made_elsewhere(image_tree, tmp_path):
    _, records, _ = image_tree
    copy = _copy_records(records, tmp_path, manifest=False)
    result = write_manifest_of(str(copy))
    assert (result["train"], result["validation"]) == (18, 6)
    written = read_json(str(copy / MANIFEST))
    original = read_json(os.path.join(records, MANIFEST))
    assert written == make_manifest({s: e["files"] for s, e in original["splits"].items()}, None)
    assert TFRecordImages(str(copy)).num_train == 18


def test_counting_names_a_truncated_file(image_tree, tmp_path):
    _, records, _ = image_tree
    copy = _copy_records(records, tmp_path)
    files = sorted(str(copy / n) for n in os.listdir(copy) if n.startswith("train-"))
    assert sum(records_per_file(files)) == 18
    with open(files[2], "r+b") as fh:
        fh.truncate(os.path.getsize(files[2]) - 5)
    with pytest.raises(DataError, match=f"^{files[2]}: corrupt or truncated TFRecord file"):
        records_per_file(files)


def test_image_folder_reads_jpeg_and_png_in_class_order(image_tree):
    folder, _, _ = image_tree
    data = load_dataset("image-folder", folder, image_size=36)
    assert data.classes == ["class_00", "class_01", "class_02"] and data.num_classes == 3
    images, labels = next(iter(data.train(0, 1, batch_size=18, seed=0)))
    assert images.shape == (18, 36, 36, 3) and sorted(labels.numpy().tolist()) == [0] * 6 + [1] * 6 + [2] * 6
    # Class c is dominated by colour channel c: check it survived decoding and normalisation.
    means = images.numpy().mean(axis=(1, 2))
    assert all(np.argmax(m) == y for m, y in zip(means, labels.numpy()))


def test_missing_folders_and_files_are_named(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path}/none: TFRecord folder not found"):
        TFRecordImages(str(tmp_path / "none"))
    with pytest.raises(DataError, match=f"{tmp_path}: no files matching train-\\*"):
        TFRecordImages(str(tmp_path))
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match=f"{tmp_path}/train: no class sub-folders"):
        ImageFolder(str(tmp_path))
    with pytest.raises(ConfigError, match="--dataset imagenet needs --data-dir"):
        load_dataset("imagenet")


def test_corrupt_records_and_images_are_found_and_named(image_tree, tmp_path):
    _, records, _ = image_tree
    good = os.path.join(records, "train-00001-of-00004")
    truncated = tmp_path / "train-truncated"
    truncated.write_bytes(open(good, "rb").read()[:-7])
    assert f"{truncated}: corrupt or truncated TFRecord file" in find_bad_record(str(truncated), 3)
    bad_image = tmp_path / "train-badimage"
    example = tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff\xd8 not a jpeg"])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[2]))}))
    with tf.io.TFRecordWriter(str(bad_image)) as writer:
        writer.write(example.SerializeToString())
    assert find_bad_record(str(bad_image), 3).startswith(f"{bad_image}: record 0 holds an undecodable image")
    assert find_bad_record(good, 3) is None


def _record(label=None, encoded=None):
    feature = {}
    if label is not None:
        feature["image/class/label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    if encoded is not None:
        feature["image/encoded"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.mark.parametrize("bad, message", [
    (_record(label=4, encoded=tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()),
     "record 5 has label 4, expected 1..3"),
    (_record(label=1), "record 5 is not an image example (missing or bad features)"),
    (b"not an example", "record 5 is not an image example (missing or bad features)"),
])
def test_the_first_bad_record_among_many_is_found_by_its_index(tmp_path, bad, message):
    good = _record(label=2, encoded=tf.io.encode_png(np.zeros((6, 6, 3), np.uint8)).numpy())
    path = tmp_path / "train-mixed"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(40):
            writer.write(bad if i in (5, 30) else good)
    assert find_bad_record(str(path), 3) == f"{path}: {message}"


def test_a_truncated_file_is_named_with_the_last_record_read(tmp_path):
    path = tmp_path / "train-short"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(10):
            writer.write(_record(label=1, encoded=tf.io.encode_png(np.zeros((3, 3, 3), np.uint8)).numpy()))
    path.write_bytes(path.read_bytes()[:-3])
    assert find_bad_record(str(path), 3) == f"{path}: corrupt or truncated TFRecord file after record 8"


def test_image_folder_names_its_broken_image_without_training(tmp_path):
    folder = write_image_folder(str(tmp_path / "imgs"), classes=2, train_per_class=4, val_per_class=1)
    broken = os.path.join(folder, "train", "class_01", "img_001.jpg")
    with open(broken, "wb") as fh:
        fh.write(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    data = ImageFolder(folder, image_size=32)
    problems = [data.find_bad_input(rank, 2) for rank in range(2)]
    # Only the worker whose shard holds the file finds it.
    assert [p for p in problems if p] == [problems[data.train_paths.index(broken) % 2]]
    assert problems[data.train_paths.index(broken) % 2].startswith(f"{broken}: undecodable image")


@pytest.mark.long  # 12 seconds here
@pytest.mark.slow
def test_training_on_a_folder_with_a_broken_image_names_it(tmp_path):
    folder = write_image_folder(str(tmp_path / "imgs"), classes=2, train_per_class=4, val_per_class=1)
    broken = os.path.join(folder, "train", "class_01", "img_001.jpg")
    with open(broken, "wb") as fh:
        fh.write(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    with pytest.raises(DataError, match="undecodable image"):
        convert(folder, str(tmp_path / "out"))
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--dataset", "image-folder", "--data-dir", folder,
         "--image-size", "32", "--batch-size", "2", "--epochs", "1", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"hvdtrain: error: {broken}: undecodable image")
