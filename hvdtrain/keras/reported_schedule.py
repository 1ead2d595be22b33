"""A period set at rounds from what the workers report: each worker adds a small float64
vector to the trigger's rounds, the round sums it over the workers, and every worker sets
the same next period from the same sum.

A blocking round sends the report in a small allreduce of its own, right after the
state's; an overlapped round carries it (`hvdtrain.keras.round_reports.SummedReport`), so
the period set at round k+1 comes from the report of the period before round k (every
worker applies a round at the same step, so all still agree). Subclasses say what they
report and how they learn from the sum: the training loss (`adaptive_rounds`, auto) or
the time in rounds against the time in steps (`link_rounds`, link).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.keras.kept_schedule import KeptSchedule


class ReportedSchedule(KeptSchedule):
    """A trigger whose period the workers' summed reports set, kept with the model.
    `LocalSGD` tells it of batches, epochs, the warm start's end and the trigger's rounds;
    each subclass takes what it needs of them."""

    length: int          # floats in a report
    collective: str      # the name of the allreduce that sums them

    def __init__(self, trigger, name: str):
        super().__init__(trigger, name)
        self._total = None
        self._traced_for = None

    def report(self) -> np.ndarray:
        """This worker's report since the last one, which starts the next."""
        raise NotImplementedError

    def learn(self, summed) -> None:
        """From the workers' summed reports: set the period, and keep it."""
        raise NotImplementedError

    def begin_epoch(self) -> None:
        """A fit's epoch begins."""

    def batch_begun(self) -> None:
        """A batch's steps begin on this worker."""

    def batch_ended(self, batch: int, steps: int, logs) -> None:
        """The batch ending at 0-based index `batch` of the epoch ran `steps` steps and
        logged `logs`; called before any round it brings."""

    def round_took(self, seconds: float) -> None:
        """A round of the trigger's held this worker for `seconds`."""

    def warm_start_ended(self) -> None:
        """The warm start handed over: what was reported of it is dropped, since local
        periods start here."""
        self.report()

    def exchange_and_learn(self) -> int:
        """After a blocking round: sum the reports over workers now and learn from them.
        Returns the bytes handed to allreduce."""
        # Traced, since only a graph op keeps its collective's name; traced again whenever
        # the workers change, since one worker's graph holds no collective at all (an
        # elastic job that grew from one worker would otherwise sum alone, and the worker
        # that joined would wait for it for ever).
        if self._traced_for != comm.world_id():
            self._traced_for = comm.world_id()
            self._total = tf.function(
                lambda report: comm.total([report], name=self.collective)[0],
                input_signature=[tf.TensorSpec([self.length], tf.float64)])
        self.learn(self._total(tf.constant(self.report())).numpy())
        return 8 * self.length if comm.size() > 1 else 0
