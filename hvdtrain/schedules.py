"""Learning-rate maths: how the peak rate follows the global batch (the linear scaling
rule of Goyal et al. 2017, or the square-root rule), and gradual warmup.

`learning_rate_at` is the pure definition; `hvdtrain.keras.schedule` evaluates
the same formula in TensorFlow ops for a Keras optimizer, and the tests hold the
two against each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REFERENCE_BATCH = 256
# How the rate follows the global batch B: linear, base x B/256 (Goyal et al. 2017);
# sqrt, base x sqrt(B/256), which keeps the variance of a step's update (Krizhevsky
# 2014, Hoffer et al. 2017); none, base whatever B is.
LR_SCALINGS = ("linear", "sqrt", "none")
# LAMB's own cap: at 0.03 it ended 0.6, 4.4 and 3.0 points above SGD's defaults at 8 x 64,
# 16 x 64 and 32 x 32 (LeNet, 3 seeds each); at 0.1 it sat at chance (BENCHMARKS.md, "LARS
# and LAMB"). LARS keeps SGD's, which its rates (10 to 30 times SGD's) need lifted.
DEFAULT_MAX_LR = {"lamb": 0.03}
DEFAULT_MAX_LR_OTHERWISE = 0.1
# Flat local mode's LAMB steps are one worker's batch each, and a round's mean of 32 such
# steps likely cancels much of their noise and with it their length: at 32 x 32 a cap of
# 0.06 (the peak there 0.05, local's rule counting 4 workers) ended 0.66 points above 0.03 over
# 2 epochs and 0.45 over 5, at every seed, and level with it at 16 x 64 (+0.05); in sync
# mode 0.06 cost 4.4 points (BENCHMARKS.md, "Local mode at 16 and 32 workers"). The cancelling needs
# each worker's momentum its own: with --average-optimizer-state the workers share 0.9 of
# it, their steps point alike and a round keeps their length, as sync's step does. There
# 0.06 ended 5.7 points below momentum kept local at 16 x 64, or diverged in int8 rounds,
# so averaged state takes sync's cap (BENCHMARKS.md, "LAMB's state averaged in rounds").
# So do rescaled rounds (--rescale-rounds, on by default with LAMB), which give a round's
# mean step the workers' own length back: 0.06 is for --no-rescale-rounds.
DEFAULT_LOCAL_LAMB_MAX_LR = 0.06
# Step decay multiplies the rate by 0.1 at these fractions of the post-warmup steps.
STEP_DECAY_POINTS = (0.5, 0.75)


def scaled_lr(base_lr: float, global_batch: int, scaling: str = "linear",
              max_lr: float = 0.0) -> float:
    """The rate for `global_batch`: base_lr is the rate for a global batch of 256, scaled
    by `scaling` (LR_SCALINGS), then capped at `max_lr` (0: no cap)."""
    ratio = global_batch / REFERENCE_BATCH
    if scaling == "linear":
        rate = base_lr * ratio
    elif scaling == "sqrt":
        rate = base_lr * math.sqrt(ratio)
    elif scaling == "none":
        rate = base_lr
    else:
        raise ValueError(f"unknown learning-rate scaling {scaling!r}")
    return min(rate, max_lr) if max_lr > 0 else rate


def default_max_lr(optimizer: str, mode: str, hierarchical: bool,
                   average_optimizer_state: bool = False, rescale_rounds: bool = False) -> float:
    """The cap on the peak rate when --max-lr is not given."""
    if optimizer == "lamb" and mode == "local" and not hierarchical \
            and not average_optimizer_state and not rescale_rounds:
        return DEFAULT_LOCAL_LAMB_MAX_LR
    return DEFAULT_MAX_LR.get(optimizer, DEFAULT_MAX_LR_OTHERWISE)


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule in optimizer steps of `workers` × `per_worker_batch` examples.

    The rate is scaled to `lr_workers` × `per_worker_batch` (0: `workers`) by
    `lr_scaling`, then capped at `max_lr` (0: no cap); local SGD counts fewer workers
    than it has (`lr_scaling_workers`).

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
    lr_scaling: str = "linear"
    max_lr: float = 0.0

    @property
    def peak_lr(self) -> float:
        return scaled_lr(self.base_lr, self.per_worker_batch * (self.lr_workers or self.workers),
                         self.lr_scaling, self.max_lr)

    @property
    def initial_lr(self) -> float:
        # Warmup starts from the rate one worker would use alone under the same rule,
        # which is never above the peak: every rule grows with the batch, and the cap
        # holds both.
        return scaled_lr(self.base_lr, self.per_worker_batch, self.lr_scaling, self.max_lr)


def lr_scaling_workers(workers: int, local_steps: bool, cap: int, host_workers: int = 0) -> int:
    """The workers the linear scaling rule counts: all of them when gradients are
    averaged every step; at most `cap` (0: no cap) when workers take local steps, each
    of which sees one worker's batch however many workers there are.

    Hierarchical local SGD (`host_workers`: the workers of this one's host) averages a
    host's gradients every step: it counts those, but never fewer than flat local SGD
    counts at the same job size, so that hosts of one worker are flat local SGD. Counting
    the host alone ran hosts of 2 at half flat local's rate at 8 workers, and there the
    hierarchy ended below flat local SGD (BENCHMARKS.md, the recipe's hierarchy).
    """
    if not local_steps:
        return workers
    flat = min(workers, cap) if cap > 0 else workers
    return max(host_workers, flat)


def schedule_in_examples(base_lr: float, per_worker_batch: int, workers: int,
                         warmup_examples: float, total_examples: float, decay: str,
                         examples_done: int, steps_done: int,
                         lr_workers: int = 0, lr_scaling: str = "linear",
                         max_lr: float = 0.0) -> ScheduleSpec:
    """The schedule for the current workers of a run whose lengths are in examples.

    After `steps_done` optimizer steps that consumed `examples_done` examples, step
    `steps_done` of the new workers continues at the position of `examples_done`.
    """
    global_batch = per_worker_batch * workers
    return ScheduleSpec(base_lr, per_worker_batch, workers, warmup_examples / global_batch,
                        total_examples / global_batch, decay,
                        examples_done / global_batch - steps_done, lr_workers, lr_scaling,
                        max_lr)


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
