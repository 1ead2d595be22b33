import gzip
import os
import struct

import numpy as np
import pytest

from hvdtrain.data import fashion_mnist
from hvdtrain.data.idx import read_idx, read_images_and_labels
from hvdtrain.errors import DataError

from helpers import write_idx


@pytest.mark.parametrize("name", ["images.idx", "images.idx.gz"])
def test_idx_round_trip_plain_and_gzipped(tmp_path, name):
    images = np.random.default_rng(0).integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    write_idx(str(tmp_path / name), images)
    np.testing.assert_array_equal(read_idx(str(tmp_path / name), 3), images)


def test_wrong_magic_is_named_with_the_file(tmp_path):
    path = str(tmp_path / "labels")
    write_idx(path, np.zeros(4, np.uint8))
    with pytest.raises(DataError, match=f"{path}: bad IDX magic number 0x00000801, expected 0x00000803"):
        read_idx(path, 3)


def test_truncated_file_reports_expected_and_found_bytes(tmp_path):
    path = str(tmp_path / "t.gz")
    write_idx(path, np.zeros((10, 28, 28), np.uint8))
    with gzip.open(path) as fh:
        raw = fh.read()
    with gzip.open(path, "wb") as fh:
        fh.write(raw[:-100])
    with pytest.raises(DataError, match=r"truncated: header says shape \(10, 28, 28\) \(7840 data bytes\), found 7740"):
        read_idx(path, 3)


def test_trailing_bytes_and_tiny_files_are_rejected(tmp_path):
    path = str(tmp_path / "x")
    with open(path, "wb") as fh:
        fh.write(struct.pack(">HBBI", 0, 8, 1, 3) + b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match="has trailing bytes"):
        read_idx(path, 1)
    with open(path, "wb") as fh:
        fh.write(b"\x00\x00")
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(path, 1)


def test_not_gzip_despite_name_is_a_clear_error(tmp_path):
    path = str(tmp_path / "fake.gz")
    with open(path, "wb") as fh:
        fh.write(b"plain bytes, not gzip")
    with pytest.raises(DataError, match=f"{path}: cannot read"):
        read_idx(path, 3)


def test_label_count_and_range_checked(tmp_path):
    images, labels = str(tmp_path / "i"), str(tmp_path / "l")
    write_idx(images, np.zeros((3, 2, 2), np.uint8))
    write_idx(labels, np.zeros(2, np.uint8))
    with pytest.raises(DataError, match="2 labels for 3 images"):
        read_images_and_labels(images, labels)
    write_idx(labels, np.array([0, 1, 12], np.uint8))
    with pytest.raises(DataError, match="label 12 is not below 10"):
        read_images_and_labels(images, labels)


def test_fashion_mnist_loader_reads_a_folder_of_idx_files(idx_dataset_dir):
    data = fashion_mnist.load(idx_dataset_dir)
    assert data.train_images.shape == (512, 28, 28, 1) and data.test_images.shape == (128, 28, 28, 1)
    assert data.train_labels.dtype == np.int32 and set(np.unique(data.train_labels)) <= set(range(10))


def test_fashion_mnist_missing_folder_and_file_messages(tmp_path, idx_dataset_dir):
    with pytest.raises(DataError, match=f"{tmp_path}/none: Fashion-MNIST folder not found"):
        fashion_mnist.load(str(tmp_path / "none"))
    os.remove(os.path.join(idx_dataset_dir, "t10k-labels-idx1-ubyte.gz"))
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte\\[.gz\\]: file not found"):
        fashion_mnist.load(idx_dataset_dir)


def test_missing_default_folder_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(fashion_mnist, "DEFAULT_DIR", str(tmp_path / "absent"))
    with pytest.raises(DataError, match="apt-get install -y dataset-fashion-mnist"):
        fashion_mnist.load(None)
