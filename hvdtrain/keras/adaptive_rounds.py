"""`LocalSGD(n_sync="auto")`: the workers' training loss travels with the rounds, and the
period follows it (`hvdtrain.rounds.triggers.AdaptivePeriod`).

Each worker sums its own minibatch losses since the last round; a round sums the sums
and the step counts over workers, so every worker learns the same mean loss and sets
the same period. A blocking round sends them in a small allreduce of its own, right
after the state's; an overlapped round carries them as its report, so the period set at
round k+1 comes from the loss of the period before round k (every worker applies a
round at the same step, so all still agree).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.keras.kept_schedule import KeptSchedule
from hvdtrain.rounds.triggers import AdaptivePeriod, LossSinceRound

REPORT_LENGTH = 2      # (sum of losses, steps)
REPORT_BYTES = 8 * REPORT_LENGTH


class AdaptiveRounds(KeptSchedule):
    """The adaptive trigger, its schedule kept with the model, and the loss it learns from."""

    def __init__(self, trigger: AdaptivePeriod):
        super().__init__(trigger, "adaptive_period")
        self.loss = LossSinceRound()
        self._total = None
        self._traced_for = None

    def observe(self, batch: int, logs) -> None:
        if logs is not None and "loss" in logs:
            self.loss.observe(batch, float(logs["loss"]))

    def report(self) -> np.ndarray:
        """This worker's (sum, steps) since the last round, for an overlapped round."""
        return np.array(self.loss.take(), np.float64)

    def learn(self, summed) -> None:
        """From the workers' summed reports: set the period by their mean loss."""
        total, steps = (float(v) for v in summed)
        if steps > 0:
            self.trigger.learn(total / steps)
            self.keep()

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
                lambda report: comm.total([report], name="adaptive_period_loss")[0],
                input_signature=[tf.TensorSpec([REPORT_LENGTH], tf.float64)])
        self.learn(self._total(tf.constant(self.report())).numpy())
        return REPORT_BYTES if comm.size() > 1 else 0
