"""`LocalSGD(n_sync="qsr:B:G")`: the workers' learning rates travel with the rounds, and
the period follows their mean (`hvdtrain.rounds.triggers.RateFollowingPeriod`).

Each worker reports the rate of the job's step at the round, read from its own
optimizer's schedule; a round sums the rates and the workers over the world
(`hvdtrain.keras.reported_schedule`), so every worker learns the same mean and sets the
same period. Each worker deriving the period from its own rate would not do: hosts of
unequal size train at different rates (each scales its own), and at a ratio the rule
floors exactly (a step decay's tenth gives 100 steps) float32 rates that differ in their
last bits give 100 on one host and 99 on the other, and the rounds part. In a flat job
every worker reports the same rate, and its mean comes back exactly as it went.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hvdtrain.keras.reported_schedule import ReportedSchedule
from hvdtrain.rounds.triggers import RateFollowingPeriod


class RateRounds(ReportedSchedule):
    """The rate-following trigger, its schedule kept with the model, and the rate it
    reports. `rate()` is this worker's learning rate at the job's step now: read at the
    job's count, never at its optimizer's, which a step skipped on overflow leaves behind."""

    length = 2      # (sum of rates, workers)
    collective = "rate_period_rates"

    def __init__(self, trigger: RateFollowingPeriod, rate: Callable[[], float]):
        # The variable's name predates the rates' report: checkpoints hold it.
        super().__init__(trigger, "rate_period")
        self.rate = rate

    def report(self) -> np.ndarray:
        """This worker's rate now, and itself counted once."""
        return np.array([self.rate(), 1.0], np.float64)

    def learn(self, summed) -> None:
        """Set the period from the workers' mean rate."""
        total, workers = (float(v) for v in summed)
        if workers > 0:
            self.trigger.learn(total / workers)
            self.keep()
