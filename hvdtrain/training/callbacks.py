"""Callbacks of the `hvdtrain train` command: progress, throughput, logs, checkpoints, guards.

They read the run's counts from its one `TrainingProgress`, which `CountProgress`
(first in the list) advances after every step.
"""

from __future__ import annotations

import json
import math
import time

import keras
import tensorflow as tf

from hvdtrain import comm, files
from hvdtrain.errors import TrainingDiverged
from hvdtrain.keras.state import current_learning_rate, set_optimizer_step
from hvdtrain.progress import TrainingProgress, executed_steps
from hvdtrain.rounds.save_plan import PendingSave, SavePlan
from hvdtrain.stats import per_batch_values
from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress


class CountProgress(keras.callbacks.Callback):
    """Advances the run's progress by the steps each batch callback covers; put it first.

    The progress owns the step count; at every fit's start the optimizer's step, which
    the learning-rate schedule reads, is set from it (`TrainingProgress.steps` says why).
    """

    def __init__(self, progress: TrainingProgress, batch_size: int):
        super().__init__()
        self.progress = progress
        self.batch_size = batch_size
        self._begin = 0

    def on_train_begin(self, logs=None):
        set_optimizer_step(self.model.optimizer, self.progress.steps)

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self.progress.advance(executed_steps(self._begin, batch), self.batch_size, comm.size())


class ThroughputMeter(keras.callbacks.Callback):
    """The job's training images per second, evaluation excluded.

    Each worker times an epoch from the end of its own first batch, which leaves out
    graph tracing and pipeline start-up, to the epoch's end as this callback sees it,
    after the state callbacks' epoch-end round (local SGD's cost, as the rounds within
    the epoch are), and counts the examples it trained in between. Workers need not move in lockstep (local SGD's
    independent steps, rounds every T seconds, a straggler), so the job's rate is the
    job's examples over the job's span: from the earliest first-batch end to the latest
    epoch end (`job_rate`); a worker that started late cannot claim the whole job's
    images for its own shorter span. The workers agree on it in one allgather at the
    epoch end, so every rank must have this callback, and all log the same rate.

    Clocks: a worker places its span on the wall clock (`time.time()`, comparable
    across hosts) and measures its length with the monotonic `time.perf_counter()`, so
    a clock adjusted mid-epoch does not stretch it. Hosts' wall clocks differ by what
    NTP leaves, milliseconds, which moves the job's span by as much: small against an
    epoch, and the skew of ranks on one machine is none.
    """

    def __init__(self, progress: TrainingProgress):
        super().__init__()
        self.progress = progress
        self.timed_images = 0   # all workers together
        self.timed_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._wall_start = self._start = self._end = None
        self._first_examples = 0
        self._eval_start = self._eval_end = 0.0

    def on_train_batch_end(self, batch, logs=None):
        if self._start is None:
            self._wall_start, self._start = time.time(), time.perf_counter()
            self._first_examples = self.progress.own_examples
            self._eval_start = self.progress.eval_seconds
        self._end = time.perf_counter()
        self._eval_end = self.progress.eval_seconds  # --eval-every's evaluations are no training

    def on_epoch_end(self, epoch, logs=None):
        if self._start is not None:
            # The epoch ends here, not at its last batch: the epoch-end round and the views of
            # the average before validation (the state callbacks, before this one) are
            # training's cost; validation itself is evaluation, and left out as such.
            self._end = time.perf_counter()
            self._eval_end = self.progress.eval_seconds
        rows = comm.gather_rows(tf.constant([self._span()], tf.float64), name="epoch_throughput")
        images, seconds = job_rate([row.numpy()[0].tolist() for row in rows])
        self.timed_images += images
        self.timed_seconds += seconds
        if logs is not None:
            logs["images_per_sec"] = images / seconds if seconds > 0 else 0.0

    def _span(self) -> list[float]:
        """[start, end] of this worker's epoch on the wall clock, its seconds evaluating
        within, and the examples it trained after its first batch."""
        if self._start is None:  # no batch ended here this epoch
            return [math.inf, -math.inf, 0.0, 0.0]
        return [self._wall_start, self._wall_start + self._end - self._start,
                self._eval_end - self._eval_start,
                float(self.progress.own_examples - self._first_examples)]

    @property
    def images_per_sec(self) -> float:
        """The job's rate over the whole run; the same on every worker."""
        return self.timed_images / self.timed_seconds if self.timed_seconds > 0 else 0.0


def job_rate(spans: list[list[float]]) -> tuple[int, float]:
    """(images, seconds) of the job in one epoch from each worker's [start, end,
    eval_seconds, images]: every worker's images, over the span from the earliest start
    to the latest end less the evaluations within it. Those are collective (all workers
    evaluate together), so each worker timed about the same pause: their mean is left out."""
    timed = [span for span in spans if span[0] <= span[1]]
    if not timed:
        return 0, 0.0
    start, end = min(span[0] for span in timed), max(span[1] for span in timed)
    evaluating = sum(span[2] for span in timed) / len(timed)
    return round(sum(span[3] for span in timed)), max(0.0, end - start - evaluating)


class MetricsLog(keras.callbacks.Callback):
    """One JSON object per epoch in metrics.jsonl (rank 0 only; after MetricAverage)."""

    def __init__(self, path: str, start_time: float, progress: TrainingProgress):
        super().__init__()
        self.path = path
        self.start_time = start_time
        self.progress = progress

    def on_epoch_end(self, epoch, logs=None):
        record = {k: float(v) for k, v in (logs or {}).items()}
        # The epochs the job's examples have completed: Keras's count, except when one
        # period of timed rounds carried the count past more than one boundary.
        ended = self.progress.epoch if self.progress.epoch_examples else epoch + 1
        if ended > epoch + 1:
            record["epochs_passed"] = ended - epoch  # this line ends them all
        record.update(
            epoch=ended,
            step=self.progress.steps,
            examples=self.progress.examples,
            lr=float(current_learning_rate(self.model.optimizer).numpy()),
            # This process's wall clock; the run's training seconds, every process's.
            wall_seconds=time.time() - self.start_time,
            train_seconds=self.progress.trained_seconds(),
            workers=comm.size(),
            steps_per_worker=self.progress.steps_by_worker(comm.size()),
        )
        files.append_jsonl(self.path, record)


class StepLog(keras.callbacks.Callback):
    """Training loss and error of every step, in steps.jsonl: the data of learning curves.

    Each worker keeps its own minibatch values; at the epoch end (and at each elastic
    commit, see `flush`) one allreduce combines them and rank 0 appends a line per
    step (`step`, `examples`, `loss`, `error` = 1 − accuracy, `wall_seconds` since the
    run started). In local mode the workers' models differ between rounds, so a step's
    line is the mean of what each worker saw on its own minibatch. Steps up to
    `chief_only_steps` (a one-worker warm start, whose other workers' steps are
    discarded) log rank 0's values alone. With rounds every T seconds (`per_worker`) the
    workers take different numbers of steps: each of a worker's steps gets a line of its
    own, with its `rank`, `step` counting that worker's steps in this process and
    `examples` its count of the job's. Every rank must have this callback.
    """

    def __init__(self, path: str, start_time: float, progress: TrainingProgress,
                 chief_only_steps: int = 0, per_worker: bool = False):
        super().__init__()
        self.path = path  # written by whichever worker is rank 0 at the time
        self.start_time = start_time
        self.progress = progress
        self.chief_only_steps = chief_only_steps
        self.per_worker = per_worker

    def on_epoch_begin(self, epoch, logs=None):
        # Keras's running means of this epoch, and how many of their steps are written.
        self._loss, self._accuracy, self._wall, self._steps, self._examples = [], [], [], [], []
        self._written = 0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        self._loss.append(float(logs.get("loss", math.nan)))
        self._accuracy.append(float(logs.get("accuracy", math.nan)))
        self._wall.append(time.time() - self.start_time)
        self._steps.append(self.progress.own_steps if self.per_worker else self.progress.steps)
        self._examples.append(self.progress.examples)

    def on_epoch_end(self, epoch, logs=None):
        self.flush()

    def _shares(self, steps: list[int]) -> tf.Tensor:
        """Each step's weight in the sum over workers: 1/K, or all of it on rank 0."""
        chief = 1.0 if comm.is_chief() else 0.0
        return tf.constant([chief if step <= self.chief_only_steps else 1.0 / comm.size()
                            for step in steps], tf.float64)

    def flush(self) -> None:
        """Combine and write the steps not yet written; a collective call.

        An elastic job calls it before every commit: a change of workers resumes from
        the commit and restarts the epoch's bookkeeping, so what was buffered before
        the commit would otherwise never be written.
        """
        if self.per_worker:
            self._flush_per_worker()
            return
        first = self._written
        if first == len(self._loss):  # the same on every worker: steps are in lockstep
            return
        values = tf.constant([per_batch_values(self._loss)[first:],
                              per_batch_values(self._accuracy)[first:]], dtype=tf.float64)
        steps = self._steps[first:]
        (combined,) = comm.total([values * self._shares(steps)], name=f"step_log_{steps[0]}")
        self._written = len(self._loss)
        if not comm.is_chief():
            return
        lines = [json.dumps({"step": step, "examples": examples, "loss": loss,
                             "error": 1.0 - accuracy, "wall_seconds": round(wall, 4)}) + "\n"
                 for step, examples, loss, accuracy, wall
                 in zip(steps, self._examples[first:], *combined.numpy().tolist(),
                        self._wall[first:])]
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)

    def _flush_per_worker(self) -> None:
        first = self._written
        columns = [self._steps, self._examples, per_batch_values(self._loss),
                   per_batch_values(self._accuracy), self._wall]
        rows = tf.constant([column[first:] for column in columns], tf.float64,
                           shape=[len(columns), len(self._loss) - first])
        gathered = comm.gather_rows(tf.transpose(rows), name="step_log_rows")
        self._written = len(self._loss)
        if not comm.is_chief():
            return
        lines = [(wall, json.dumps({"rank": rank, "step": int(step), "examples": int(examples),
                                    "loss": loss, "error": 1.0 - accuracy,
                                    "wall_seconds": round(wall, 4)}) + "\n")
                 for rank, table in enumerate(gathered)
                 for step, examples, loss, accuracy, wall in table.numpy().tolist()]
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(line for _, line in sorted(lines, key=lambda pair: pair[0]))


class SavePoints:
    """Where a callback that saves writes what fell due (`pending`, a `PendingSave` of the
    run's `SavePlan`): at the first batch end where the workers agree (in local mode, after
    a round), or an epoch's end.

    An epoch's last step waits for the epoch's end, after the callbacks that log it: saved
    before, a crash or a resize in between would lose that epoch's line for good, since
    training resumes at the next epoch. LocalSGD keeps the same `PendingSave` rule
    (`ConsensusWanted`), so the round a save waits for is whole and comes within a period.
    """

    def __init__(self, pending: PendingSave, progress: TrainingProgress):
        self.pending = pending
        self.progress = progress
        self._begin = 0

    def batch_begun(self, batch: int) -> None:
        self._begin = batch

    def at_batch_end(self, batch: int, steps_in_epoch: int | None) -> bool:
        """Whether to save now, after Keras's `batch` of an epoch of `steps_in_epoch`."""
        steps = self.progress.steps
        self.pending.after_steps(range(steps - executed_steps(self._begin, batch) + 1,
                                       steps + 1))
        last_of_epoch = batch + 1 == steps_in_epoch
        return self.pending.due and self.progress.in_consensus and not last_of_epoch

    def at_epoch_end(self, epochs_done: int) -> bool:
        """Whether to save now, at the end of the `epochs_done`-th epoch (1-based)."""
        self.pending.after_epoch(epochs_done)
        return self.pending.due and self.progress.in_consensus

    def saved(self) -> None:
        self.pending.written()

    def begin_fit(self) -> None:
        """A fit starts: a save still waiting is written in it, unless the workers are
        another set (an elastic reset), which voids it (`PendingSave.begin_fit`)."""
        self.pending.begin_fit(comm.world_id())


class Checkpointer(keras.callbacks.Callback):
    """Saves a checkpoint where the run's `SavePlan` says: every N steps or epochs (rank 0
    only; after the state callbacks).

    A checkpoint, of steps or of an epoch, waits for consensus, and an epoch's last step
    for the epoch's end (`SavePoints`); in local mode without epoch rounds the period's
    next round, which LocalSGD makes whole for it, across `fit` calls. What is saved is
    so always the consensus model. Weights that are not finite are never saved: the last
    good checkpoint stays the newest.
    """

    def __init__(self, store: CheckpointStore, state: tf.train.Checkpoint, saves: SavePlan,
                 progress: TrainingProgress, batch_size: int):
        super().__init__()
        self.store = store
        self.state = state
        self.saves = saves
        self.progress = progress
        self.batch_size = batch_size
        self._points = SavePoints(saves.pending_checkpoint(), progress)

    def _save(self) -> None:
        step = self.progress.steps
        if not all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in self.model.weights):
            raise TrainingDiverged(f"weights are not finite at step {step}; not saving. "
                                   f"Last good checkpoint: {self.store.newest() or 'none'}")
        # The progress's seconds (trained, evaluated) are the run's so far, kept with it.
        self.store.save(self.state, SavedProgress(
            TrainingProgress(**self.progress.saved()), comm.size(), self.batch_size))
        self._points.saved()

    def on_train_begin(self, logs=None):
        self._points.begin_fit()

    def on_train_batch_begin(self, batch, logs=None):
        self._points.batch_begun(batch)

    def on_train_batch_end(self, batch, logs=None):
        if self._points.at_batch_end(batch, self.params.get("steps")):
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self._points.at_epoch_end(epoch + 1):
            self._save()


class ElasticCommit(keras.callbacks.Callback):
    """Commits the elastic state where the run's `SavePlan` says: every N steps and at
    epoch ends.

    A commit is where a failed worker's peers roll back to, and where workers that
    joined are let in. In local mode it waits for consensus, like a checkpoint.
    Place it after the callbacks that log and checkpoint epochs: a commit that lets
    workers in ends this `fit` at once, and an epoch whose end callbacks had not run
    by then would never be logged, since training resumes at the next epoch. For the
    same reason an epoch's last step is committed at the epoch end (`SavePoints`).
    `step_log` is flushed first, so no step of the committed stretch goes unlogged.
    """

    def __init__(self, state, saves: SavePlan, progress: TrainingProgress, step_log=None):
        super().__init__()
        self.state = state
        self.progress = progress
        self.step_log = step_log
        self._points = SavePoints(saves.pending_commit(), progress)

    def _commit(self):
        if self.step_log is not None:
            self.step_log.flush()
        self.state.progress = self.progress.saved()
        self._points.saved()
        self.state.commit()

    def on_train_begin(self, logs=None):
        self._points.begin_fit()

    def on_train_batch_begin(self, batch, logs=None):
        self._points.batch_begun(batch)

    def on_train_batch_end(self, batch, logs=None):
        if self._points.at_batch_end(batch, self.params.get("steps")):
            self._commit()

    def on_epoch_end(self, epoch, logs=None):
        self._commit()


class FiniteLossGuard(keras.callbacks.Callback):
    """Stops training at the first step whose loss is NaN or infinite, naming the step."""

    def __init__(self, progress: TrainingProgress, store: CheckpointStore | None = None):
        super().__init__()
        self.progress = progress
        self.store = store

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            newest = self.store.newest() if self.store is not None else None
            raise TrainingDiverged(
                f"loss is {float(loss)} at step {self.progress.steps}; stopping. "
                f"Last good checkpoint: {newest or 'none'}")
