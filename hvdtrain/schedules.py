"""Learning-rate maths: the linear scaling rule and gradual warmup (Goyal et al. 2017).

`learning_rate_at` is the pure definition; `hvdtrain.keras.schedule` evaluates
the same formula in TensorFlow ops for a Keras optimizer, and the tests hold the
two against each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REFERENCE_BATCH = 256
# Step decay multiplies the rate by 0.1 at these fractions of the post-warmup steps.
STEP_DECAY_POINTS = (0.5, 0.75)


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: base_lr is the rate for a global batch of 256."""
    return base_lr * global_batch / REFERENCE_BATCH


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule in optimizer steps of `workers` × `per_worker_batch` examples.

    The rate is scaled to `lr_workers` × `per_worker_batch` (0: `workers`); local SGD
    counts fewer workers than it has (`lr_scaling_workers`).

    `step_offset` is added to the optimizer's step count: a run that continues with a
    different number of workers (elastic, or resumed with another -np) starts its new
    schedule at the position its examples so far correspond to, so step counts (and
    the warmup and total lengths) may be fractional.
    """

    base_lr: float
    per_worker_batch: int
    workers: int
    warmup_steps: float
    total_steps: float
    decay: str = "cosine"
    step_offset: float = 0.0
    lr_workers: int = 0

    @property
    def peak_lr(self) -> float:
        return scaled_lr(self.base_lr, self.per_worker_batch * (self.lr_workers or self.workers))

    @property
    def initial_lr(self) -> float:
        # Warmup starts from the rate one worker would use alone.
        return scaled_lr(self.base_lr, self.per_worker_batch)


def lr_scaling_workers(workers: int, local_steps: bool, cap: int) -> int:
    """The workers the linear scaling rule counts: all of them when gradients are
    averaged every step; at most `cap` (0: no cap) when workers take local steps, each
    of which sees one worker's batch however many workers there are."""
    return min(workers, cap) if local_steps and cap > 0 else workers


def schedule_in_examples(base_lr: float, per_worker_batch: int, workers: int,
                         warmup_examples: float, total_examples: float, decay: str,
                         examples_done: int, steps_done: int,
                         lr_workers: int = 0) -> ScheduleSpec:
    """The schedule for the current workers of a run whose lengths are in examples.

    After `steps_done` optimizer steps that consumed `examples_done` examples, step
    `steps_done` of the new workers continues at the position of `examples_done`.
    """
    global_batch = per_worker_batch * workers
    return ScheduleSpec(base_lr, per_worker_batch, workers, warmup_examples / global_batch,
                        total_examples / global_batch, decay,
                        examples_done / global_batch - steps_done, lr_workers)


def learning_rate_at(step: int, spec: ScheduleSpec) -> float:
    """The rate used for optimizer step `step` (0-based)."""
    step = step + spec.step_offset
    peak, initial = spec.peak_lr, spec.initial_lr
    if step < spec.warmup_steps:
        return initial + (peak - initial) * step / spec.warmup_steps
    decay_steps = max(spec.total_steps - spec.warmup_steps, 1)
    progress = min(max(step - spec.warmup_steps, 0) / decay_steps, 1.0)
    if spec.decay == "constant":
        return peak
    if spec.decay == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    if spec.decay == "step":
        return peak * 0.1 ** sum(progress >= point for point in STEP_DECAY_POINTS)
    raise ValueError(f"unknown decay {spec.decay!r}")
