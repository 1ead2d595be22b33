"""The bookkeeping of rounds every T seconds, for `LocalSGD(sync_seconds=...)`.

Out of step, a worker knows the job's progress only from the reports its rounds carry
(`hvdtrain.rounds.timed`). This object keeps those counts, says where the epoch ends
and whether a round ends it, and gives the job's step that the learning-rate schedule
follows. The callback decides when rounds happen and runs them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.timed import ReportedCounts


class TimedEpochs:
    """One worker's view of the job's examples and epochs while rounds are timed."""

    def __init__(self, progress: TrainingProgress, batch_size: int):
        self.progress = progress
        self.batch_size = batch_size
        self.counts: ReportedCounts | None = None
        self.epoch_end = 0            # the job's examples at which this epoch ends
        self.stopped = False          # whether a round has ended this epoch
        self._origin: tuple[int, int] | None = None  # (optimizer step, examples) at start
        self._sum_reports = None

    def begin(self, optimizer_step: int, in_step: bool) -> None:
        """Start counting from here: at train begin, and when the warm start hands over."""
        # Alone, or within the warm start, the workers are in step and count exactly.
        self.progress.workers_in_step = comm.size() == 1 or in_step
        self.counts = ReportedCounts(self.progress, comm.rank(), comm.size())
        if self._origin is None:
            # Where the job's step count stood; rounds move it by the job's examples.
            self._origin = (optimizer_step, self.progress.examples)
        if self._sum_reports is None:
            spec = tf.TensorSpec([comm.size() + 1], tf.float64)
            self._sum_reports = tf.function(
                lambda report: comm.total([report], name="round_reports")[0],
                input_signature=[spec])
            self._sum_reports.get_concrete_function()  # traced now, not in the first round

    def begin_epoch(self) -> None:
        length = self.progress.epoch_examples
        self.epoch_end = (self.progress.examples // length + 1) * length
        self.stopped = False

    @property
    def reporting(self) -> bool:
        """Whether rounds carry reports: once the workers are out of step."""
        return not self.progress.workers_in_step

    @property
    def report_bytes(self) -> int:
        """What a report adds to a round (float64 counts), once out of step."""
        return 8 * (comm.size() + 1) if self.reporting else 0

    def report(self) -> np.ndarray:
        return self.counts.report()

    def exchange_report(self) -> int:
        """A blocking round's report, summed across workers now; returns the job's step."""
        return self.learn(self._sum_reports(tf.constant(self.report())).numpy())

    def learn(self, summed) -> int:
        """Take in a round's summed reports; returns the job's step (examples / global
        batch from where counting began), which the schedule should follow."""
        self.counts.learn(summed)
        steps, examples = self._origin
        return steps + (self.progress.examples - examples) // (self.batch_size * comm.size())

    def round_may_end_epoch(self) -> bool:
        """Whether the next overlapped round should block instead, since the count (one
        period late) plus the last period's examples reaches the epoch's end."""
        return self.counts.epoch_end_due(self.epoch_end, overlapped=True)

    def count_reached_end(self) -> bool:
        """After a blocking round: whether the exact count has reached the epoch's end."""
        return self.counts.known >= self.epoch_end

    def in_step_past_end(self) -> bool:
        """In step every worker counts the same examples, so all find the end at one step."""
        return self.progress.workers_in_step and self.progress.examples >= self.epoch_end
