"""Keras callbacks for data-parallel training with Horovod; they compose with any `model.fit`.

Order them as listed in `hvdtrain.keras.__doc__`: state broadcast and averaging
first, metric averaging next, then anything that reads metrics (loggers,
checkpoints), which should run on rank 0 only.
"""

from __future__ import annotations

import contextlib
import numbers

import keras

from hvdtrain import comm
from hvdtrain.keras.initial_state import InitialState
from hvdtrain.keras.state import ModelStateAverager
from hvdtrain.progress import TrainingProgress


class BroadcastInitialState(keras.callbacks.Callback):
    """Copies rank 0's weights and optimizer state to every worker before the first step.

    Horovod's own callback does this after the first batch; here it happens in
    `on_train_begin`, so step one already starts from identical weights. Later `fit`
    calls with the same workers send nothing (`hvdtrain.keras.initial_state`). With a
    `progress`, the bytes sent are added to its `broadcast_bytes`.
    """

    def __init__(self, root_rank: int = 0, progress: TrainingProgress | None = None):
        super().__init__()
        self.initial_state = InitialState(root_rank)
        self.progress = progress

    def on_train_begin(self, logs=None):
        sent = self.initial_state.give(self.model)
        if self.progress is not None:
            self.progress.broadcast_bytes += sent


class MetricAverage(keras.callbacks.Callback):
    """Replaces every numeric epoch log with its mean over workers, so all ranks agree."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        numeric = {k: v for k, v in logs.items()
                   if isinstance(v, numbers.Number) or (hasattr(v, "shape") and v.shape == ())}
        logs.update(comm.average_scalars(numeric, name=f"epoch_{epoch}_metrics"))


class AverageModelStatistics(keras.callbacks.Callback):
    """Averages non-trainable state (BatchNorm moving statistics) at every epoch end.

    In synchronous training the weights stay identical but each worker's BatchNorm
    statistics see only its own shard; averaging them before evaluation and
    checkpointing makes the evaluated and saved model the same on every rank. With a
    `progress`, the bytes each round hands to allreduce are added to its count.
    """

    def __init__(self, progress: TrainingProgress | None = None):
        super().__init__()
        self.progress = progress
        self.averager: ModelStateAverager | None = None
        self._pending = False

    # No outer optimizer, no round schedule in sync mode: nothing beyond the model to keep.
    kept_state: dict = {}
    # Steps between two exchanges: gradients are averaged every step.
    period = 1

    def attach(self, model: keras.Model) -> ModelStateAverager:
        if self.averager is None:
            self.averager = ModelStateAverager(model, trainable=False, statistics=True)
        return self.averager

    def on_train_begin(self, logs=None):
        self.attach(self.model)

    def on_train_batch_end(self, batch, logs=None):
        self._pending = True

    def _average_pending(self):
        if self._pending and self.averager is not None and self.averager.variables:
            self.averager.average()
            if self.progress is not None:
                self.progress.state_bytes += self.averager.bytes_per_round
        self._pending = False

    def evaluating(self) -> contextlib.AbstractContextManager:
        """Average the statistics now unless no step has changed them since the last time,
        for an evaluation (within the returned context, which keeps them)."""
        self._average_pending()
        return contextlib.nullcontext()

    def on_test_begin(self, logs=None):
        self._average_pending()

    def on_epoch_end(self, epoch, logs=None):
        self._average_pending()
