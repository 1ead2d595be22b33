"""Callbacks of the `hvdtrain train` command: throughput, metrics log, checkpoints, guards."""

from __future__ import annotations

import json
import math
import time
from typing import Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.errors import HvdtrainError
from hvdtrain.keras.state import current_learning_rate
from hvdtrain.stats import per_batch_values
from hvdtrain import files
from hvdtrain.training.checkpoints import CheckpointStore, Progress


class TrainingDiverged(HvdtrainError):
    """The loss or the weights stopped being finite."""

    exit_code = 4


class ThroughputMeter(keras.callbacks.Callback):
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


class MetricsLog(keras.callbacks.Callback):
    """One JSON object per epoch in metrics.jsonl (rank 0 only; after MetricAverage)."""

    def __init__(self, path: str, start_time: float, workers: Callable[[], int] = lambda: 1):
        super().__init__()
        self.path = path
        self.start_time = start_time
        self.workers = workers

    def on_epoch_end(self, epoch, logs=None):
        record = {k: float(v) for k, v in (logs or {}).items()}
        record.update(
            epoch=epoch + 1,
            step=int(self.model.optimizer.iterations.numpy()),
            lr=float(current_learning_rate(self.model.optimizer).numpy()),
            wall_seconds=time.time() - self.start_time,
            workers=self.workers(),
        )
        files.append_jsonl(self.path, record)


class StepLog(keras.callbacks.Callback):
    """Training loss and error of every step, in steps.jsonl: the data of learning curves.

    Each worker keeps its own minibatch values; at the epoch end (and at each elastic
    commit, see `flush`) one allreduce averages them over workers and rank 0 appends a
    line per step (`step`, `loss`, `error` = 1 − accuracy, `wall_seconds` since the run
    started). In local mode the workers' models differ between rounds, so this is the
    mean of what each worker saw on its own minibatch. Every rank must have this callback.
    """

    def __init__(self, path: str, start_time: float):
        super().__init__()
        self.path = path  # written by whichever worker is rank 0 at the time
        self.start_time = start_time

    def on_epoch_begin(self, epoch, logs=None):
        self._first_step = int(self.model.optimizer.iterations.numpy()) + 1
        # Keras's running means of this epoch, and how many of their steps are written.
        self._loss, self._accuracy, self._wall = [], [], []
        self._written = 0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        self._loss.append(float(logs.get("loss", math.nan)))
        self._accuracy.append(float(logs.get("accuracy", math.nan)))
        self._wall.append(time.time() - self.start_time)

    def on_epoch_end(self, epoch, logs=None):
        self.flush()

    def flush(self) -> None:
        """Average and write the steps not yet written; a collective call.

        An elastic job calls it before every commit: a change of workers resumes from
        the commit and restarts the epoch's bookkeeping, so what was buffered before
        the commit would otherwise never be written.
        """
        first = self._written
        if first == len(self._loss):  # the same on every worker: steps are in lockstep
            return
        values = tf.constant([per_batch_values(self._loss)[first:],
                              per_batch_values(self._accuracy)[first:]], dtype=tf.float64)
        (mean,) = comm.average([values], name=f"step_log_{self._first_step + first}")
        self._written = len(self._loss)
        if not comm.is_chief():
            return
        lines = [json.dumps({"step": self._first_step + first + i, "loss": loss,
                             "error": 1.0 - accuracy, "wall_seconds": round(wall, 4)}) + "\n"
                 for i, (loss, accuracy, wall)
                 in enumerate(zip(*mean.numpy().tolist(), self._wall[first:]))]
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)


class Checkpointer(keras.callbacks.Callback):
    """Saves a checkpoint every N steps or epochs (rank 0 only; after the state callbacks).

    In local mode a step checkpoint that falls between averaging rounds waits for the
    next round, so what is saved is always the consensus model. Weights that are not
    finite are never saved: the last good checkpoint stays the newest.
    """

    def __init__(self, store: CheckpointStore, state: tf.train.Checkpoint, interval: tuple[str, int],
                 progress: Callable[[], Progress], in_sync: Callable[[], bool] = lambda: True):
        super().__init__()
        self.store = store
        self.state = state
        self.unit, self.every = interval
        self.progress = progress
        self.in_sync = in_sync
        self._due = False
        self.last_saved: str | None = None

    def _save(self) -> None:
        progress = self.progress()
        if not all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in self.model.weights):
            raise TrainingDiverged(f"weights are not finite at step {progress.step}; not saving. "
                                   f"Last good checkpoint: {self.last_saved or 'none'}")
        self.last_saved = self.store.save(self.state, progress)
        self._due = False

    def on_train_batch_end(self, batch, logs=None):
        if self.unit != "steps":
            return
        step = self.progress().step
        self._due = self._due or step % self.every == 0
        if self._due and self.in_sync():
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self.unit == "epochs" and (epoch + 1) % self.every == 0:
            self._save()


class ElasticCommit(keras.callbacks.Callback):
    """Commits the elastic state every N steps and at epoch ends.

    A commit is where a failed worker's peers roll back to, and where workers that
    joined are let in. In local mode it waits for an averaging round, like a checkpoint.
    Place it after the callbacks that log and checkpoint epochs: a commit that lets
    workers in ends this `fit` at once, and an epoch whose end callbacks had not run
    by then would never be logged, since training resumes at the next epoch. For the
    same reason an epoch's last step is committed at the epoch end, not at batch end.
    """

    def __init__(self, state, every: int, in_sync: Callable[[], bool] = lambda: True,
                 sync_count: Callable[[], int] = lambda: 0,
                 before_commit: Callable[[], None] = lambda: None):
        super().__init__()
        self.state = state
        self.every = every
        self.in_sync = in_sync
        self.sync_count = sync_count
        self.before_commit = before_commit  # e.g. StepLog.flush
        self._due = False

    def _commit(self):
        self.before_commit()
        self.state.sync_count = self.sync_count()
        self._due = False
        self.state.commit()

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self._due = self._due or step % self.every == 0
        last_of_epoch = batch + 1 == self.params.get("steps")
        if self._due and self.in_sync() and not last_of_epoch:
            self._commit()

    def on_epoch_end(self, epoch, logs=None):
        self._commit()


class FiniteLossGuard(keras.callbacks.Callback):
    """Stops training at the first step whose loss is NaN or infinite, naming the step."""

    def __init__(self, last_checkpoint: Callable[[], str | None] = lambda: None):
        super().__init__()
        self.last_checkpoint = last_checkpoint

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            step = int(self.model.optimizer.iterations.numpy())
            raise TrainingDiverged(
                f"loss is {float(loss)} at step {step}; stopping. "
                f"Last good checkpoint: {self.last_checkpoint() or 'none'}")
