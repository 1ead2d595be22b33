"""What a local SGD round carries besides the model's state, one class per kind.

A report is a small float64 vector that every worker adds to a round and that the
round sums. A blocking round exchanges it in an allreduce of its own; an overlapped
round carries it, and the sum arrives with the round's mean, one period later.

- `NoReport`: a fixed period needs nothing but the state.
- `SummedReport`: `n_sync="auto"`, `"qsr:B:G"` and `"link"`: what every worker saw (its
  training loss since the last round; its learning rate now; its time in rounds and in
  steps), from whose sum every worker sets the same next period
  (`hvdtrain.keras.reported_schedule`). Only the trigger's own rounds carry it, after the
  state. No worker sets a period from its own floats alone: nearly equal values (two
  hosts' rates) can round to different periods, and the rounds would part.
- `CountReport`: rounds every T seconds: the examples and steps each worker took
  (`hvdtrain.rounds.timed`). Every round carries it once the workers are out of step, a
  blocking one before the state, since the job's step it gives sets the learning rate
  that SlowMo's outer step divides by.

Each method returns the bytes it handed to allreduce, for the run's count.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hvdtrain import comm
from hvdtrain.keras.reported_schedule import ReportedSchedule
from hvdtrain.keras.timed_epochs import TimedEpochs


class NoReport:
    carries = False  # whether overlapped rounds carry a report

    def length(self) -> int | None:
        """Length of the report an overlapped round carries (None: it carries none)."""
        return None

    def before_state(self) -> int:
        """At the start of every blocking round."""
        return 0

    def after_state(self) -> int:
        """After a blocking round the trigger held (not after one that only reaches
        consensus, nor the warm start's hand-over)."""
        return 0

    def carried(self) -> np.ndarray | None:
        """What this worker adds to an overlapped round it starts now."""
        return None

    def learn(self, summed: np.ndarray | None) -> None:
        """The sum an overlapped round brought back."""

    def round_held(self) -> None:
        """After the trigger held a round, of either kind."""


class SummedReport(NoReport):
    carries = True

    def __init__(self, schedule: ReportedSchedule):
        self.schedule = schedule

    def length(self) -> int:
        return self.schedule.length

    def after_state(self) -> int:
        return self.schedule.exchange_and_learn()

    def carried(self) -> np.ndarray:
        return self.schedule.report()

    def learn(self, summed) -> None:
        if summed is not None:
            self.schedule.learn(summed)

    def round_held(self) -> None:
        self.schedule.keep()


class CountReport(NoReport):
    carries = True

    def __init__(self, timed: TimedEpochs, follow_job_step: Callable[[int], None]):
        self.timed = timed
        self.follow_job_step = follow_job_step

    def length(self) -> int:
        return comm.size() + 1  # the workers' number shapes it: asked when traced

    def before_state(self) -> int:
        if not self.timed.reporting:  # in step, every worker knows the counts already
            return 0
        self.follow_job_step(self.timed.exchange_report())
        return self.timed.report_bytes

    def carried(self) -> np.ndarray:
        return self.timed.report()

    def learn(self, summed) -> None:
        if summed is not None:
            self.follow_job_step(self.timed.learn(summed))
