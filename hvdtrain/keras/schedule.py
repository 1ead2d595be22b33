"""`learning_rate_at` as a Keras LearningRateSchedule, evaluated per optimizer step."""

from __future__ import annotations

import math
from dataclasses import asdict

import keras
import tensorflow as tf

from hvdtrain.errors import ArgumentError
from hvdtrain.keras.state import base_optimizer
from hvdtrain.schedules import STEP_DECAY_POINTS, ScheduleSpec


@keras.saving.register_keras_serializable(package="hvdtrain")
class WarmupDecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from the one-worker rate to the scaled rate, then decay."""

    def __init__(self, base_lr, per_worker_batch, workers, warmup_steps, total_steps,
                 decay="cosine", step_offset=0.0, lr_workers=0, lr_scaling="linear",
                 max_lr=0.0):
        super().__init__()
        self.spec = ScheduleSpec(base_lr, per_worker_batch, workers, warmup_steps,
                                 total_steps, decay, step_offset, lr_workers, lr_scaling,
                                 max_lr)

    @classmethod
    def from_spec(cls, spec: ScheduleSpec) -> "WarmupDecaySchedule":
        return cls(**asdict(spec))

    def __call__(self, step):
        spec = self.spec
        step = tf.cast(step, tf.float32) + spec.step_offset
        peak = tf.constant(spec.peak_lr, tf.float32)
        decay_steps = float(max(spec.total_steps - spec.warmup_steps, 1))
        progress = tf.clip_by_value((step - spec.warmup_steps) / decay_steps, 0.0, 1.0)
        if spec.decay == "constant":
            decayed = peak
        elif spec.decay == "cosine":
            decayed = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif spec.decay == "step":
            drops = tf.add_n([tf.cast(progress >= p, tf.float32) for p in STEP_DECAY_POINTS])
            decayed = peak * tf.pow(0.1, drops)
        else:
            raise ArgumentError(f"unknown decay {spec.decay!r}")
        if spec.warmup_steps == 0:
            return decayed
        initial = tf.constant(spec.initial_lr, tf.float32)
        ramp = initial + (peak - initial) * step / float(spec.warmup_steps)
        return tf.where(step < spec.warmup_steps, ramp, decayed)

    def get_config(self):
        return asdict(self.spec)


def peak_learning_rate(optimizer) -> float | None:
    """The peak of the optimizer's WarmupDecaySchedule (None for any other rate)."""
    schedule = getattr(base_optimizer(optimizer), "_learning_rate", None)
    return schedule.spec.peak_lr if isinstance(schedule, WarmupDecaySchedule) else None
