"""What the runner needs from a dataset, whatever its format."""

from __future__ import annotations

import abc

import numpy as np
import tensorflow as tf

from hvdtrain.errors import ConfigError


class DataSource(abc.ABC):
    """A train and a test split, read by each worker from its own shard.

    `train` must be repeated and batched with drop_remainder, so every worker can
    run the same number of steps; `test` covers this worker's shard once.
    `train(..., start_step=s)` continues the stream a run that stopped after s steps
    would have read: exactly for in-memory data, from the same epoch's file order for
    file-based data.
    """

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int

    @property
    @abc.abstractmethod
    def num_train(self) -> int:
        """Training examples in all shards together (DataError while not known)."""

    @property
    def size_is_cheap(self) -> bool:
        """False while `num_train` is unknown: only `count_train`, reading every file, can tell."""
        return True

    def limit_train(self, count: int) -> "DataSource":
        """--train-examples: in-memory data keeps its first `count` examples; TFRecords take
        `count` as their number of training records. ConfigError where it cannot apply."""
        raise ConfigError(f"--train-examples does not apply to --dataset {self.name}, "
                          f"got --train-examples {count}")

    def keep_shard(self, rank: int, workers: int) -> None:
        """Let go of what only other workers read, for a job whose workers never change
        (no --elastic); after it, only worker `rank` of `workers` may read. Readers of
        files hold names, not images, and open their own shard's files only: they keep
        everything."""

    def count_train(self) -> int:
        """`num_train`, counted if need be: then a full pass over the training files.

        Local, no communication: call it on one worker, share the result, and pass it to
        `limit_train` on every worker.
        """
        return self.num_train

    # True when the data has no natural epoch (random images): --steps-per-epoch is then
    # taken as given rather than capped at one pass over the shard.
    endless: bool = False

    @abc.abstractmethod
    def shard(self, rank: int, workers: int) -> np.ndarray:
        """What this worker trains on: example indices or file names."""

    @abc.abstractmethod
    def train(self, rank: int, workers: int, batch_size: int, seed: int,
              start_step: int = 0) -> tf.data.Dataset:
        ...

    @abc.abstractmethod
    def test(self, rank: int, workers: int, batch_size: int) -> tf.data.Dataset:
        ...

    def find_bad_input(self, rank: int, workers: int) -> str | None:
        """After a decode failure: the file (and record) at fault in this shard, or None."""
        return None
