"""A period set anew at rounds, kept with the model: the trigger's schedule as a variable."""

from __future__ import annotations

import tensorflow as tf


class KeptSchedule:
    """`trigger.saved()` as a float64 variable, so that it travels as the model does: in
    checkpoints, elastic commits and rank 0's initial broadcast (`keep`, `take_kept`)."""

    def __init__(self, trigger, name: str):
        self.trigger = trigger
        self.kept = tf.Variable(trigger.saved(), dtype=tf.float64, trainable=False, name=name)

    def keep(self) -> None:
        """Write the schedule into `kept`: after every round that changed it."""
        self.kept.assign(self.trigger.saved())

    def take_kept(self) -> None:
        """Go on with the schedule in `kept`: at every fit's start, after rank 0's state
        (a checkpoint's, an elastic commit's) has reached every worker."""
        self.trigger.restore(self.kept.numpy().tolist())
