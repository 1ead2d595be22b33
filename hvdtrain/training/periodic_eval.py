"""`--eval-every N`: test accuracy within epochs, the data of time-to-accuracy curves.

Every N steps all workers first hold one model (a blocking averaging round in local
and async mode, with --no-epoch-rounds the workers' average shown for the evaluation
only; the BatchNorm statistics' round in sync mode), then evaluate it on the test
split or a fixed part of it, each worker its shard, summed exactly.
Rank 0 appends a line to metrics.jsonl with `"eval": true`.

The time spent evaluating (here and in Keras's validation after each epoch) is added to
`TrainingProgress.eval_seconds`, so `train_seconds` in the line is the wall time that
training alone took, every process of the run's (a resumed run's goes on from its
checkpoint's): what time to accuracy should compare. `wall_seconds` is this process's.
The consensus round counts as training: it moves the model like any other round.
"""

from __future__ import annotations

import time
from typing import Callable

import keras
import tensorflow as tf

from hvdtrain import comm, files
from hvdtrain.progress import TrainingProgress, executed_steps
from hvdtrain.training.evaluation import TestEvaluation
from hvdtrain.training.summary import allreduced_bytes


class PeriodicEvaluation(keras.callbacks.Callback):
    """Evaluates the consensus model every `every` steps; put it right after the state
    callback (so the throughput meter, next, can leave its time out). Every rank must
    have it: evaluation and the round before it are collective calls.

    Args:
      every: steps between two evaluations (the job's steps, equal on every worker).
      test_data: makes this worker's part of the test split, for the current workers.
      state_sync: `LocalSGD` or `AverageModelStatistics`: the evaluation runs within its
        `evaluating()`, and its `period` (steps between rounds now) goes into the line.
      fp16_allreduce: whether gradients travel as float16 (for the bytes so far).
      beat: called after each test batch: the step watchdog's, so that an evaluation
        longer than one --step-timeout still counts as progress, batch by batch.

    With `every` 0 it evaluates nothing itself and only times Keras's validation.
    """

    def __init__(self, every: int, test_data: Callable[[], tf.data.Dataset],
                 state_sync, progress: TrainingProgress, start_time: float, log_path: str,
                 fp16_allreduce: bool = False, beat: Callable[[], None] | None = None):
        super().__init__()
        self.every = every
        self.test_data = test_data
        self.state_sync = state_sync
        self.progress = progress
        self.start_time = start_time
        self.log_path = log_path
        self.fp16_allreduce = fp16_allreduce
        self.beat = beat
        self._evaluation: TestEvaluation | None = None
        self._begin = 0
        self._test_started: float | None = None

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        if not self.every:
            return
        last = self.progress.steps
        first = last - executed_steps(self._begin, batch) + 1
        if any(step % self.every == 0 for step in range(first, last + 1)):
            self.evaluate_now()

    # Keras's own validation after each epoch is evaluation time too.
    def on_test_begin(self, logs=None):
        self._test_started = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._test_started is not None:
            self.progress.eval_seconds += time.perf_counter() - self._test_started
        self._test_started = None

    def evaluate_now(self) -> dict:
        """One evaluation of the workers' one model; returns the record (rank 0 also
        logs it)."""
        with self.state_sync.evaluating():
            started = time.perf_counter()
            if self._evaluation is None:
                self._evaluation = TestEvaluation(self.model)
            loss, accuracy = self._evaluation(self.test_data(), on_batch=self.beat,
                                              name=f"periodic_evaluation_{self.progress.steps}")
            self.progress.eval_seconds += time.perf_counter() - started
        record = self._record(loss, accuracy)
        if comm.is_chief():
            files.append_jsonl(self.log_path, record)
        return record

    def _record(self, loss: float, accuracy: float) -> dict:
        wall = time.time() - self.start_time
        progress = self.progress
        return {"eval": True, "step": progress.steps, "examples": progress.examples,
                "epoch": progress.examples / progress.epoch_examples
                if progress.epoch_examples else None,
                "test_accuracy": accuracy, "test_loss": loss,
                "wall_seconds": wall, "train_seconds": progress.trained_seconds(),
                "bytes_allreduced": allreduced_bytes(self.model, progress, self.fp16_allreduce),
                "averaging_rounds": progress.averaging_rounds,
                "n_sync": self.state_sync.period, "workers": comm.size()}
