"""`LocalSGD(n_sync="auto")`: the workers' training loss travels with the rounds, and the
period follows it (`hvdtrain.rounds.triggers.AdaptivePeriod`).

Each worker sums its own minibatch losses since the last round; a round sums the sums
and the step counts over workers (`hvdtrain.keras.reported_schedule`), so every worker
learns the same mean loss and sets the same period.
"""

from __future__ import annotations

import numpy as np

from hvdtrain.keras.reported_schedule import ReportedSchedule
from hvdtrain.rounds.triggers import AdaptivePeriod, LossSinceRound


class AdaptiveRounds(ReportedSchedule):
    """The adaptive trigger, its schedule kept with the model, and the loss it learns from."""

    length = 2      # (sum of losses, steps)
    collective = "adaptive_period_loss"

    def __init__(self, trigger: AdaptivePeriod):
        # The variable's name predates the other reported schedules: checkpoints hold it.
        super().__init__(trigger, "adaptive_period")
        self.loss = LossSinceRound()

    def begin_epoch(self) -> None:
        self.loss.begin_epoch()

    def batch_ended(self, batch: int, steps: int, logs) -> None:
        if logs is not None and "loss" in logs:
            self.loss.observe(batch, float(logs["loss"]))

    def report(self) -> np.ndarray:
        """This worker's (sum, steps) since the last round."""
        return np.array(self.loss.take(), np.float64)

    def learn(self, summed) -> None:
        """Set the period by the workers' mean loss (F₀ is the first local period's)."""
        total, steps = (float(v) for v in summed)
        if steps > 0:
            self.trigger.learn(total / steps)
            self.keep()
