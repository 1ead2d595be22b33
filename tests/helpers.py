"""Data makers and readers shared by tests and by the worker scripts that tests launch."""

from __future__ import annotations

import gzip
import json
import os
import struct

import numpy as np
import yaml

from hvdtrain.data.idx import UBYTE_TYPE
from hvdtrain.rounds.fragments import fragments_of


def write_idx(path: str, array: np.ndarray) -> None:
    """Write uint8 data as IDX (gzipped when the name ends in .gz), as Fashion-MNIST ships it."""
    array = np.asarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, UBYTE_TYPE, array.ndim)
    header += struct.pack(">" + "I" * array.ndim, *array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as fh:
        fh.write(header + array.tobytes())


def learnable_images(n: int, seed: int, num_classes: int = 10, size: int = 28):
    """Noise plus a bright square whose position encodes the class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n).astype(np.uint8)
    images = rng.integers(0, 80, size=(n, size, size), dtype=np.uint8)
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 4)
        images[i, 2 + 6 * row:6 + 6 * row, 2 + 6 * col:6 + 6 * col] = 255
    return images, labels


def write_learnable_idx_dataset(folder: str, train: int, test: int) -> str:
    os.makedirs(folder, exist_ok=True)
    for prefix, n, seed in (("train", train, 1), ("t10k", test, 2)):
        images, labels = learnable_images(n, seed)
        write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return folder


def write_image_folder(root: str, classes: int = 3, train_per_class: int = 6,
                       val_per_class: int = 2, seed: int = 0) -> str:
    """root/train/<class>/*.jpg|png and root/val/<class>/*: real encoded images of varied sizes.

    Each class has its own dominant colour, so a model can learn it.
    """
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = os.path.join(root, split, f"class_{c:02d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                h, w = int(rng.integers(24, 60)), int(rng.integers(24, 60))
                image = rng.integers(0, 60, size=(h, w, 3)).astype(np.uint8)
                image[..., c % 3] += 150
                if i % 3 == 2:
                    data, ext = tf.io.encode_png(image).numpy(), "png"
                else:
                    data, ext = tf.io.encode_jpeg(image).numpy(), "jpg"
                with open(os.path.join(folder, f"img_{i:03d}.{ext}"), "wb") as fh:
                    fh.write(data)
    return root


def runs_on_learnable_data(root, runs: dict[str, dict]) -> list[dict]:
    """One train_worker-style run spec per named config, each on a small learnable IDX
    dataset under `root` and with its own run folder there."""
    data_dir = write_learnable_idx_dataset(os.path.join(str(root), "data"), train=512, test=128)
    return [{"name": name, "config": dict(cfg, data_dir=data_dir,
                                          out=os.path.join(str(root), f"run-{name}"))}
            for name, cfg in runs.items()]


def finished_sweep_run(folder, seed, accuracy, workers=1):
    """A run folder as `hvdtrain train` leaves it, so a sweep tabulates it untrained."""
    os.makedirs(folder)
    with open(os.path.join(folder, "config.yaml"), "w") as fh:
        yaml.safe_dump({"mode": "sync", "n_sync": None, "warm_start_steps": 0, "seed": seed}, fh)
    summary = {"workers": workers, "test_accuracy": accuracy, "wall_seconds": 3.0,
               "images_per_sec": 100.0, "bytes_allreduced": 0, "averaging_rounds": 0,
               "total_steps": 4, "examples_trained": 128}
    with open(os.path.join(folder, "summary.json"), "w") as fh:
        json.dump(summary, fh)
    with open(os.path.join(folder, "steps.jsonl"), "w") as fh:
        for step in range(1, 5):
            fh.write(json.dumps({"step": step, "examples": 32 * step, "loss": 1.0,
                                 "error": 0.5, "wall_seconds": 0.5 * step}) + "\n")


def weights_in_file(path) -> dict[str, np.ndarray]:
    """Every array of a Keras `.weights.h5` file, by its path in the file."""
    import h5py

    out = {}
    with h5py.File(path) as fh:
        fh.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                      if isinstance(obj, h5py.Dataset) else None)
    return out


def lenet_fragments(shapes, count: int) -> list[list[tuple]]:
    """How `--round-fragments count` cuts LeNet's trainable variables (`shapes`, in
    order): its layers hold a kernel and a bias each, 4 bytes a value, cut between their
    last axis's columns alike. Pieces as `hvdtrain.rounds.fragments.fragments_of` gives them."""
    sizes = [int(np.prod(shape)) for shape in shapes]
    return fragments_of([i // 2 for i in range(len(shapes))], [4 * s for s in sizes], count,
                        [int(shape[-1]) for shape in shapes])


def piece_values(flat: np.ndarray, shapes, piece: tuple) -> np.ndarray:
    """A piece's values in a flat vector of variables of `shapes` (in order, C order)."""
    sizes = [int(np.prod(shape)) for shape in shapes]
    start = sum(sizes[:piece[0]])
    values = flat[start:start + sizes[piece[0]]].reshape(shapes[piece[0]])
    return values if len(piece) == 1 else values[..., piece[1]:piece[2]]


def piece_size(shapes, piece: tuple) -> int:
    size = int(np.prod(shapes[piece[0]]))
    return size if len(piece) == 1 else size // int(shapes[piece[0]][-1]) * (piece[2] - piece[1])


def agreeing_pieces(a: np.ndarray, b: np.ndarray, shapes, fragments) -> set[tuple]:
    """The pieces of `fragments` that two flat weight vectors hold to the bit."""
    return {piece for fragment in fragments for piece in fragment
            if np.array_equal(piece_values(a, shapes, piece), piece_values(b, shapes, piece))}
