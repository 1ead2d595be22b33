"""Callbacks of the `hvdtrain train` command: throughput, metrics log, checkpoints."""

from __future__ import annotations

import glob
import os
import time

import tensorflow as tf

from hvdtrain.keras.state import current_learning_rate
from hvdtrain.training import run_folder


class ThroughputMeter(tf.keras.callbacks.Callback):
    """Training images per second, evaluation excluded.

    Each epoch is timed from the end of its first batch, which leaves out graph
    tracing and pipeline start-up. Put it before `MetricAverage`: the logged
    `images_per_sec` is this worker's rate times the workers, and averaging it
    over workers gives the job's rate.
    """

    def __init__(self, batch_size: int, workers: int):
        super().__init__()
        self.batch_size = batch_size
        self.workers = workers
        self.timed_images = 0
        self.timed_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._batches = 0
        self._start = None

    def on_train_batch_end(self, batch, logs=None):
        if self._start is None:
            self._start = time.perf_counter()
        else:
            self._batches += 1
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = (self._end - self._start) if self._start is not None else 0.0
        images = self._batches * self.batch_size
        self.timed_images += images
        self.timed_seconds += seconds
        if logs is not None:
            logs["images_per_sec"] = self.workers * images / seconds if seconds > 0 else 0.0

    @property
    def images_per_sec(self) -> float:
        """This worker's rate over the whole run, times the workers."""
        if self.timed_seconds <= 0:
            return 0.0
        return self.workers * self.timed_images / self.timed_seconds


class MetricsLog(tf.keras.callbacks.Callback):
    """One JSON object per epoch in metrics.jsonl (rank 0 only; after MetricAverage)."""

    def __init__(self, path: str, start_time: float):
        super().__init__()
        self.path = path
        self.start_time = start_time

    def on_epoch_end(self, epoch, logs=None):
        record = {k: float(v) for k, v in (logs or {}).items()}
        record.update(
            epoch=epoch + 1,
            step=int(self.model.optimizer.iterations.numpy()),
            lr=float(current_learning_rate(self.model.optimizer).numpy()),
            wall_seconds=time.time() - self.start_time,
        )
        run_folder.append_jsonl(self.path, record)


class EpochCheckpoint(tf.keras.callbacks.Callback):
    """Model weights after every epoch, written atomically; keeps the newest `keep` (rank 0 only)."""

    def __init__(self, folder: str, keep: int = 2):
        super().__init__()
        self.folder = folder
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"epoch-{epoch + 1:04d}.weights.h5")
        run_folder.atomic_write(path, self.model.save_weights)
        for old in sorted(glob.glob(os.path.join(self.folder, "epoch-*.weights.h5")))[:-self.keep]:
            os.remove(old)
