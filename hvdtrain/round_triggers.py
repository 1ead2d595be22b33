"""When local SGD holds a round: one small object per policy, asked after every batch.

`hvdtrain.keras.local_sgd.LocalSGD` hands each trigger the steps the last batch
completed and asks whether a round is due. Every answer depends only on what all
workers share (their step counts, equal while rounds come every n steps) or on this
worker's own clock (rounds every T seconds, where the k-th round of each worker meets
the k-th of the others), so all workers hold the same rounds in the same order.

Pure Python: no TensorFlow, no Keras, so each policy is tested on its own.
"""

from __future__ import annotations

from typing import Sequence

from hvdtrain.averaging import is_local_sync_step, is_warm_start_end
from hvdtrain.progress import TrainingProgress
from hvdtrain.timed_rounds import RoundTimer


class WarmStartEnd:
    """The step after which the warm start hands over to local steps (none without one)."""

    def __init__(self, steps: int):
        self.steps = steps

    def due(self, done: range) -> bool:
        return any(is_warm_start_end(step, self.steps) for step in done)

    def warming(self, step: int) -> bool:
        """Whether completed step `step` still lies within the warm start."""
        return step < self.steps


class EveryNSteps:
    """A round every `n_sync` local steps after the warm start (Paine's n_sync)."""

    def __init__(self, n_sync: int, warm_start_steps: int = 0):
        self.n_sync = n_sync
        self.warm_start_steps = warm_start_steps

    def due(self, done: range) -> bool:
        return any(is_local_sync_step(step, self.n_sync, self.warm_start_steps) for step in done)

    def restart(self) -> None:
        """Nothing to restart: the step count is the clock."""


class EveryTSeconds:
    """A round once T seconds of this worker's clock have passed since its last one, while
    the workers are out of step (in step, within the warm start, steps decide)."""

    def __init__(self, timer: RoundTimer, progress: TrainingProgress):
        self.timer = timer
        self.progress = progress

    def due(self, done: range) -> bool:
        return not self.progress.workers_in_step and self.timer.due()

    def restart(self) -> None:
        self.timer.restart()


class ConsensusWanted:
    """Steps after which a callback waits for every worker to hold the same state: a step
    checkpoint every `k` steps, an elastic commit every `k` steps.

    Blocking rounds give consensus anyway. Overlapped rounds never do, so the first
    round at or after such a step must block instead, or the checkpoint would wait for
    the epoch's end. All workers see the same steps, so all make the same round block.
    """

    def __init__(self, intervals: Sequence[int] = ()):
        self.intervals = tuple(k for k in intervals if k)
        self.pending = False

    def note(self, done: range) -> None:
        """Take in the steps a batch completed."""
        if any(step % k == 0 for step in done for k in self.intervals):
            self.pending = True

    def take(self) -> bool:
        """Whether the round being held now must block; it answers for the wait it ends."""
        wanted, self.pending = self.pending, False
        return wanted
