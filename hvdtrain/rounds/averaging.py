"""The maths of local SGD: when workers average, what an averaging round does, what it costs.

Everything here is a pure function. `outer_step` uses only `+ - * /`, so it runs
unchanged on NumPy arrays in the tests and on TensorFlow tensors inside
`hvdtrain.keras.local_sgd`.

Update rules (K workers, x̄ the average of the workers' weights, γ the inner rate, the
workers' mean: hierarchical hosts of unequal size each scale their own, and every worker
must take the same outer step):
- plain local SGD (Stich 2018): every worker sets x ← x̄.
- SlowMo (Wang et al. 2020), with x₀ the weights after the previous round:
      u ← β u + (x₀ − x̄) / γ ;  x₀ ← x₀ − α γ u ;  x ← x₀
  α = 1, β = 0 gives x₀ = x̄, i.e. plain local SGD.
- Nesterov outer momentum (as DiLoCo, Douillard et al. 2023), same buffers:
      u ← β u + (x₀ − x̄) / γ ;  x₀ ← x₀ − α γ (β u + (x₀ − x̄) / γ)

BatchNorm moving variances are pooled, not averaged: the variance of all workers' data
together is the mean of their variances plus the spread of their means,
      σ² = mean_k(σ_k² + (μ_k − c)²) − (mean_k(μ_k) − c)²   for any c shared by all,
so a worker sends σ_k² + (μ_k − c)² (`second_moment`) in place of σ_k², at no extra cost.

With compressed rounds (fp16 or int8) a round sends x − x_ref, the change since the last
round's consensus x_ref, plus what the worker's last encoding cut off, and every worker
takes x_ref + the decoded mean: the encoding rounds the small change instead of the
weight itself (`hvdtrain.keras.state.ModelStateAverager`,
`hvdtrain.keras.compressed_rounds`).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

# The longest period QSR sets: at a rate of zero the rule has none (it would be infinite).
QSR_LONGEST = 1_000_000


def is_local_sync_step(step: int, n_sync: int, warm_start_steps: int = 0) -> bool:
    """True when completed step `step` (1-based) ends a round of n_sync local steps."""
    local_steps = step - warm_start_steps
    return local_steps > 0 and local_steps % n_sync == 0


def is_warm_start_end(step: int, warm_start_steps: int) -> bool:
    """The step after which the warm start hands over to local steps."""
    return warm_start_steps > 0 and step == warm_start_steps


def adacomm_period(loss: float, initial_loss: float, initial_period: int,
                   minimum: int = 1) -> int:
    """AdaComm's period (Wang & Joshi 2019): τ = ⌈√(F / F₀) · τ₀⌉, kept within [minimum, τ₀].

    Averaging matters more as the loss falls (the workers' models then differ by more,
    relative to how far they still have to go), so the period shrinks with √(F / F₀). A
    loss above F₀ (an early spike) keeps τ₀; a loss that is not a finite number, or an F₀
    that is not positive, keeps τ₀ too, so one bad value cannot make rounds rare.
    """
    if not (math.isfinite(loss) and math.isfinite(initial_loss)) or initial_loss <= 0:
        return initial_period
    ratio = min(max(loss, 0.0) / initial_loss, 1.0)
    # The tolerance keeps √0.09 · 10 = 3.0000000000000004 at 3.
    return max(minimum, min(initial_period, math.ceil(math.sqrt(ratio) * initial_period - 1e-9)))


def quadratic_period(rate: float, peak: float, base: int, growth: float) -> int:
    """The quadratic synchronization rule (QSR, Gu et al. 2024): H = max(H_base, ⌊(α/η)²⌋)
    with α = `growth` × `peak`, the highest rate of the run so far.

    A high rate needs frequent rounds (the workers drift apart at its pace); as it decays,
    its authors find, local steps cost little and drift towards flatter minima, so the
    period grows as 1/η² (over 5 epochs of LeNet it cost accuracy here: BENCHMARKS.md,
    "Rounds every step from a global batch of 1,024"). Measuring α against the peak makes
    one setting fit any scale of rate: at growth 1 the period leaves `base` once the rate
    falls below the peak divided by √(base + 1). While the rate rises (warmup) it is its
    own peak so far, and the period stays at max(base, ⌊growth²⌋). A rate of zero or below
    (the end of a decay) gives `QSR_LONGEST`: no more rounds but the epoch's and the run's
    last.
    """
    if not (math.isfinite(rate) and math.isfinite(peak)) or rate <= 0:
        return QSR_LONGEST
    return max(base, min(QSR_LONGEST, math.floor((growth * max(peak, rate) / rate) ** 2 + 1e-9)))


def link_period(round_seconds: float, step_seconds: float, share: float, maximum: int,
                minimum: int = 1) -> int:
    """The fewest local steps between rounds for which the rounds take at most `share` of a
    worker's time: a round of r seconds after P steps of t seconds each costs r / (r + P·t),
    which is at most s when P ≥ r·(1 − s) / (s·t). Kept within [minimum, maximum]: a link
    so slow that it asks for more keeps `maximum`, since a longer period costs accuracy.
    Times that are not positive finite numbers (nothing measured yet) keep `minimum`.
    """
    if not all(math.isfinite(v) and v > 0 for v in (round_seconds, step_seconds)):
        return minimum
    steps = round_seconds * (1.0 - share) / (share * step_seconds)
    # The tolerance keeps an exact ratio (2.0000000000000004) at its whole number.
    return max(minimum, min(maximum, math.ceil(steps - 1e-9)))


def is_epoch_end(step: int, steps_per_epoch: int) -> bool:
    return step % steps_per_epoch == 0


def sync_points(total_steps: int, steps_per_epoch: int, n_sync: int,
                warm_start_steps: int = 0) -> list[int]:
    """Completed steps after which local SGD averages the workers' state.

    A round runs every n_sync local steps, once when the warm start ends (after a
    synchronous one the BatchNorm statistics have drifted apart even though the
    weights have not; after a one-worker one every worker takes rank 0's state), and
    at every epoch end so that evaluation and checkpoints see the consensus model.
    """
    return [
        step for step in range(1, total_steps + 1)
        if is_local_sync_step(step, n_sync, warm_start_steps)
        or is_warm_start_end(step, warm_start_steps)
        or is_epoch_end(step, steps_per_epoch)
    ]


def gradient_steps(total_steps: int, mode: str, warm_start_steps: int = 0,
                   warm_start: str = "sync") -> int:
    """How many steps allreduce their gradients (none in a one-worker warm start)."""
    if mode == "sync":
        return total_steps
    return min(warm_start_steps, total_steps) if warm_start == "sync" else 0


def payload_bytes(shapes_and_itemsizes: Iterable[tuple[Sequence[int], int]]) -> int:
    """Bytes one worker hands to allreduce for these tensors."""
    return sum(math.prod(shape) * itemsize for shape, itemsize in shapes_and_itemsizes)


def bytes_allreduced(gradient_step_count: int, gradient_bytes: int,
                     state_sync_count: int, state_bytes: int) -> int:
    """Payload one worker allreduces over a run.

    This is what the worker submits, not what crosses the wire: a ring allreduce
    sends about 2 (K − 1) / K times it. Both modes are counted the same way, so the
    ratio between them is the saving.
    """
    return gradient_step_count * gradient_bytes + state_sync_count * state_bytes


def expected_bytes_allreduced(mode: str, total_steps: int, steps_per_epoch: int, n_sync: int,
                              warm_start_steps: int, gradient_bytes: int, state_bytes: int,
                              epoch_end_bytes: int, warm_start: str = "sync") -> int:
    """Bytes a whole run allreduces, from its shape alone.

    Sync mode averages gradients every step and non-trainable state (BatchNorm
    statistics, `epoch_end_bytes`) at each epoch end; local mode follows `sync_points`.
    A one-worker warm start's hand-over is a round like any other (rank 0's state
    travels as a sum with the others' zeros).
    """
    if mode == "sync":
        epochs = total_steps // steps_per_epoch
        return bytes_allreduced(total_steps, gradient_bytes, epochs, epoch_end_bytes)
    syncs = len(sync_points(total_steps, steps_per_epoch, n_sync, warm_start_steps))
    return bytes_allreduced(gradient_steps(total_steps, mode, warm_start_steps, warm_start),
                            gradient_bytes, syncs, state_bytes)


def outer_step(x0, x_avg, momentum_buffer, inner_lr, outer_lr: float, outer_momentum: float,
               nesterov: bool = False):
    """One SlowMo / Nesterov outer update of a single tensor; returns (new x0, new buffer)."""
    outer_grad = (x0 - x_avg) / inner_lr
    new_buffer = outer_momentum * momentum_buffer + outer_grad
    direction = outer_momentum * new_buffer + outer_grad if nesterov else new_buffer
    return x0 - outer_lr * inner_lr * direction, new_buffer


def delayed_average_update(current, snapshot, snapshot_mean):
    """A worker's state after an overlapped round (CoCoD-SGD, Shen et al. 2019).

    The round averaged `snapshot`, the state every worker took when it started; the
    worker kept training meanwhile. It takes the stale average plus its own progress
    since the snapshot, so no local step is lost: x <- avg(s) + (x - s).
    """
    return snapshot_mean + (current - snapshot)


def second_moment(mean, variance, shift=0.0):
    """One worker's mean square deviation from `shift`, what it sends in place of its variance.

    Any shift all workers share gives the same pooled variance; one near the means keeps
    (mean − shift)² small, so that float rounding of it does not swamp the variance.
    """
    deviation = mean - shift
    return variance + deviation * deviation


def pooled_variance(mean, mean_second_moment, shift=0.0):
    """Variance of all workers' data together, from the mean over workers of their means and
    of their `second_moment`s about the same `shift` (workers weighted equally).

    Clamped at 0: where the variance is about 0, the subtraction can leave a tiny negative.
    """
    deviation = mean - shift
    variance = mean_second_moment - deviation * deviation
    # max(variance, 0) written with `+ abs /`, which NumPy and TensorFlow both provide;
    # exact, since doubling and halving a float do not round.
    return (variance + abs(variance)) / 2


def gradient_buckets(sizes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """Indices of gradients grouped for allreduce, last layer first, each group up to
    `cap_bytes` (a single larger gradient gets a group of its own; cap 0: one group).

    Back-propagation produces the last layers' gradients first; a group can go out as
    soon as its own gradients exist, while earlier layers are still being computed.
    """
    order = list(reversed(range(len(sizes))))
    if cap_bytes <= 0:
        return [order] if order else []
    buckets: list[list[int]] = []
    filled = 0.0
    for i in order:
        if buckets and filled + sizes[i] <= cap_bytes:
            buckets[-1].append(i)
            filled += sizes[i]
        else:
            buckets.append([i])
            filled = sizes[i]
    return buckets
