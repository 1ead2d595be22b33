"""Reader for the IDX format of MNIST and Fashion-MNIST (gzipped or not).

Layout: a big-endian header (magic, then one 32-bit size per dimension) and uint8
data. Images have magic 0x00000803 (count, rows, cols), labels 0x00000801 (count).
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from hvdtrain.errors import DataError

UBYTE_TYPE = 0x08
IMAGE_DIMS = 3
LABEL_DIMS = 1


def _read_bytes(path: str) -> bytes:
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return fh.read()
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None


def read_idx(path: str, expected_dims: int) -> np.ndarray:
    """Read an IDX file of unsigned bytes with `expected_dims` dimensions."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: not an IDX file (only {len(raw)} bytes)")
    zero, data_type, dims = struct.unpack(">HBB", raw[:4])
    magic = struct.unpack(">I", raw[:4])[0]
    if zero != 0 or data_type != UBYTE_TYPE or dims != expected_dims:
        expected_magic = (UBYTE_TYPE << 8) | expected_dims
        raise DataError(
            f"{path}: bad IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}")
    header_len = 4 + 4 * dims
    if len(raw) < header_len:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    shape = struct.unpack(">" + "I" * dims, raw[4:header_len])
    expected = int(np.prod(shape, dtype=np.int64))
    found = len(raw) - header_len
    if found != expected:
        problem = "truncated" if found < expected else "has trailing bytes"
        raise DataError(
            f"{path}: IDX file {problem}: header says shape {tuple(shape)} "
            f"({expected} data bytes), found {found}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(shape)


def read_images_and_labels(images_path: str, labels_path: str,
                           num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path, IMAGE_DIMS)
    labels = read_idx(labels_path, LABEL_DIMS)
    if len(images) != len(labels):
        raise DataError(
            f"{labels_path}: {len(labels)} labels for {len(images)} images in {images_path}")
    if len(labels) and labels.max() >= num_classes:
        raise DataError(f"{labels_path}: label {int(labels.max())} is not below {num_classes}")
    return images, labels
