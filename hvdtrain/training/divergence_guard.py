"""`--divergence-guard`: stop a run whose training loss blew up, on every worker at once.

Every WINDOW steps of the job (`TrainingProgress.steps`, the same on every worker, also
after an elastic reset) each worker hands its losses since the last check, and its
first step's, to one allreduce of eight numbers, so all of them judge the same mean by
the same reference (`hvdtrain.divergence`) and stop at the same step: none is left
waiting in a collective for a peer that stopped. With rounds every T seconds the workers
take different numbers of steps, so they check at epoch ends instead, which they reach
together.
"""

from __future__ import annotations

import keras

from hvdtrain import comm
from hvdtrain.divergence import (STALL_EPOCHS, STALL_STEPS, WINDOW, LossHistory, agree,
                                 divergence_message, reason_to_stop, shares)
from hvdtrain.errors import TrainingDiverged
from hvdtrain.keras.schedule import peak_learning_rate
from hvdtrain.keras.state import base_optimizer
from hvdtrain.progress import TrainingProgress


class DivergenceGuard(keras.callbacks.Callback):
    """Raises TrainingDiverged (one line) when `hvdtrain.divergence` says the run diverged.

    Keras logs a running mean of the epoch's loss after each batch; the sum of the
    epoch's losses so far is that mean times the batches, so the difference between two
    such sums is the sum of the losses between them, whatever number of steps one
    callback covers. Every rank must have this callback.
    """

    def __init__(self, progress: TrainingProgress, batch_size: int, warmup_epochs: float,
                 classes: int = 0, at_epoch_ends: bool = False, judge_learning: bool = True):
        super().__init__()
        # False for data without signal (random labels): it never leaves guessing.
        self.judge_learning = judge_learning
        self.progress = progress
        self.batch_size = batch_size
        self.warmup_epochs = warmup_epochs
        self.classes = classes  # 0: no floor under the reference (hvdtrain.divergence)
        self.at_epoch_ends = at_epoch_ends
        self.history: LossHistory | None = None  # the workers agree on it at each check
        self._own_first_loss: float | None = None

    def on_train_begin(self, logs=None):
        # A fit starts a new window (an elastic reset rolls back the steps since a commit).
        self._window_sum, self._window_steps = 0.0, 0
        self._next_check = self._first_check_after(self.progress.steps)

    @staticmethod
    def _first_check_after(steps: int) -> int:
        # On the job's step count, a multiple of WINDOW, so every worker checks together.
        return (steps // WINDOW + 1) * WINDOW

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_batches, self._epoch_sum = 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        batches, total = batch + 1, (batch + 1) * float(loss)
        self._window_sum += total - self._epoch_sum
        self._window_steps += batches - self._epoch_batches
        self._epoch_batches, self._epoch_sum = batches, total
        if self._own_first_loss is None:
            self._own_first_loss = float(loss)
        if not self.at_epoch_ends and self.progress.steps >= self._next_check:
            self._next_check = self._first_check_after(self.progress.steps)
            self.check(f"divergence_guard_{self.progress.steps}")

    def on_epoch_end(self, epoch, logs=None):
        if self.at_epoch_ends:
            self.check(f"divergence_guard_epoch_{epoch}")

    def check(self, name: str) -> None:
        """One collective call: every worker agrees on the window's mean and the history,
        then all raise or none does."""
        mean = comm.average_scalars(shares(self._own_first_loss, self.history,
                                           self._window_sum, self._window_steps), name=name)
        self._window_sum, self._window_steps = 0.0, 0
        agreed = agree(mean)
        if agreed is None:
            return
        window_mean, self.history = agreed
        epoch = self.progress.epoch_examples
        warmup_examples = self.warmup_epochs * epoch
        stall_examples = warmup_examples + STALL_EPOCHS * epoch
        reason = reason_to_stop(window_mean, self.history, self.classes,
                                after_warmup=self.progress.examples > warmup_examples,
                                steps=round(mean["steps"]),
                                stall_judged=(self.judge_learning
                                              and self.progress.examples > stall_examples
                                              and self.progress.steps >= STALL_STEPS))
        if reason is not None:
            raise TrainingDiverged(divergence_message(
                reason, self.progress.steps, peak_learning_rate(self.model.optimizer),
                self.batch_size * comm.size(),
                lamb=isinstance(base_optimizer(self.model.optimizer), keras.optimizers.Lamb)))
