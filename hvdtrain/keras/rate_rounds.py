"""`LocalSGD(n_sync="qsr:B:G")`: a period that follows the learning rate
(`hvdtrain.round_triggers.RateFollowingPeriod`), and its schedule kept with the model.

Nothing travels with the rounds: every worker reads the same rate from its own
optimizer, whose steps equal the others' when a round is held. The schedule (the peak so
far, the period, the next round's step) is a variable, so that checkpoints, elastic
commits and rank 0's initial broadcast carry it as they carry the adaptive period's.
"""

from __future__ import annotations

import tensorflow as tf

from hvdtrain.keras.round_reports import NoReport
from hvdtrain.round_triggers import RateFollowingPeriod


class RateRounds:
    """The rate-following trigger, and its schedule as a variable."""

    def __init__(self, trigger: RateFollowingPeriod):
        self.trigger = trigger
        self.kept = tf.Variable(trigger.saved(), dtype=tf.float64, trainable=False,
                                name="rate_period")

    def keep(self) -> None:
        self.kept.assign(self.trigger.saved())

    def take_kept(self) -> None:
        """Go on with the schedule in `kept`: at every fit's start, after rank 0's state
        has reached every worker."""
        self.trigger.restore(self.kept.numpy().tolist())


class RateReport(NoReport):
    """No report: after each of the trigger's rounds, keep the period it set."""

    def __init__(self, rounds: RateRounds):
        self.rounds = rounds

    def round_held(self) -> None:
        self.rounds.keep()
