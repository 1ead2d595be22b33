"""`LocalSGD(n_sync="link")`: the period follows the link
(`hvdtrain.rounds.triggers.LinkFollowingPeriod`).

Each worker times its own steps (from a batch's start to its end, before any round) and
the trigger's rounds (the whole time they held it: the exchange, the encoding, and the
wait for the slowest worker). A round sums the times and counts over the workers
(`hvdtrain.keras.reported_schedule`), so every worker sets the same period from the
job's mean round against its mean step. Time spent outside both (evaluations, saves)
counts as neither.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from hvdtrain.keras.reported_schedule import ReportedSchedule
from hvdtrain.rounds.triggers import LinkFollowingPeriod


class LinkRounds(ReportedSchedule):
    """The link-following trigger, its schedule kept with the model, and this worker's
    timings since the last report."""

    length = 4      # (seconds in rounds, rounds, seconds in steps, steps)
    collective = "link_period_times"

    def __init__(self, trigger: LinkFollowingPeriod,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(trigger, "link_period")
        self.clock = clock
        self._times = np.zeros(self.length, np.float64)
        self._batch_start: float | None = None

    def batch_begun(self) -> None:
        self._batch_start = self.clock()

    def batch_ended(self, batch: int, steps: int, logs) -> None:
        if self._batch_start is not None:
            self._times[2:] += (self.clock() - self._batch_start, steps)
            self._batch_start = None

    def round_took(self, seconds: float) -> None:
        self._times[:2] += (seconds, 1)

    def report(self) -> np.ndarray:
        """This worker's times and counts since the last report."""
        report, self._times = self._times, np.zeros(self.length, np.float64)
        return report

    def learn(self, summed) -> None:
        self.trigger.learn(*(float(v) for v in summed))
        self.keep()
