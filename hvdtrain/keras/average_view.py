"""The workers' average shown for an evaluation between two rounds (`epoch_rounds=False`).

While the view is open every worker holds the workers' mean state; when it closes each
takes its own state back. It is no round: no outer step, SlowMo's x0 and the compressed
rounds' reference stay the last round's, and the workers are not in consensus for
anything else (a save waits for, or holds, a real round: `hvdtrain.rounds.policy`), so
training goes on as if the evaluation had not happened.
"""

from __future__ import annotations

import time

from hvdtrain.keras.state import ModelStateAverager, assign
from hvdtrain.progress import TrainingProgress


class AverageView:
    """A context manager: the average inside, each worker's own state back on the way out,
    an exception included."""

    def __init__(self, averager: ModelStateAverager, progress: TrainingProgress):
        self.averager = averager
        self.progress = progress
        self._own: list | None = None

    def __enter__(self) -> "AverageView":
        start = time.perf_counter()  # its allreduce is time spent in rounds
        self._own = self.averager.show_mean()
        self.progress.state_bytes += self.averager.bytes_per_round
        self.progress.round_seconds += time.perf_counter() - start
        return self

    def __exit__(self, *exc_info) -> None:
        if self._own is not None:
            assign(self.averager.variables, self._own)
            self._own = None
