"""When a run has diverged: the rule of `--divergence-guard`, and what it says (pure).

The loss is judged over windows of WINDOW steps, averaged over the workers: one step's
loss on one worker's minibatch is too noisy to stop a run on. Its reference is where
training started, the first step's loss averaged over the workers, but never below
ln(classes), the loss of guessing uniformly, which is where a fresh run starts (2.3 for
10 classes). Not the mean of a first window of steps: the blow-ups this guards against
came within it (LeNet at a global batch of 1024: loss 6.4 at step 10 at peak 0.4, 24 at
step 22 at peak 0.2), and would have raised the reference with them. The floor keeps a
run resumed, or started from --init-weights, at a low loss from being held to it.

After warmup the run stops when the mean of the last window is more than FACTOR times
the reference: a model far worse than guessing (3.45 for 10 classes), which a run that
still learns does not reach. 2 would let a blow-up that settles between 3.5 and 4.6 go
on, so 1.5. It also stops when a window rose that high earlier, during warmup, and the
loss has not come back below `left_guessing(classes)` since: a network that blew up dies
to constant outputs, whose loss is ln(classes) and whose accuracy is chance, the "silent
10%" of those runs (LeNet on the tests' small dataset at rate 2, batch 8: 69.7 at step
23, then 2.2 to 2.5 for good). That bar is ln(classes) less a margin for the noise of
such a window's mean: MARGIN_SHARE of ln(classes), 0.23 at 10 classes, or, if smaller,
MARGIN_PER_CLASS for each class beyond the first, 0.026 at 2 classes (a bar of 0.67).
The noise does not scale with ln(classes): a network of constant outputs scores on n
examples at least the entropy of their labels, which falls short of ln(classes) by about
(classes - 1) / 2n, so a dead binary network needs little room, while a bar a tenth of
ln 2 below guessing, 0.62, would stop as dead a binary run still learning slowly at 0.64
(a calibrated 65% right). From 10 classes up the margin is a tenth of ln(classes); a run
that recovered learns on, well below the bar. During warmup only a non-finite loss, or
one EXPLODED times the reference, stops the run: the rate is still rising, and a rise
may recover (LeNet's 6.4 at a global batch of 1024 did, at peak 0.1), but not from a
mean of 23 for 10 classes, where the true class's probability is e^-23 on average: a
2-worker run at --base-lr 50 trained a whole epoch of warmup at a loss of 1e18 before
the rule after warmup stopped it.

A run can also die without ever rising: LAMB at a peak of 0.1 (16 x 64, LeNet) sat at
ln(10) from its first epoch and ended at 10%, never above where it started. So once
STALL_EPOCHS of training have passed after warmup, and at least STALL_STEPS steps, a run
whose window means have never come below `left_guessing(classes)` stops too. Not
sooner: a healthy run at a small rate takes a while to leave guessing (LeNet at a peak
of 0.003 on the tests' small dataset was still at 2.26 after 20 steps); the LAMB run
above was judged at step 100 of 117. A dataset without signal (random labels) cannot
leave guessing, so the caller turns this rule off for it (`judge_learning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from hvdtrain.schedules import DEFAULT_MAX_LR

WINDOW = 20
FACTOR = 1.5
# left_guessing: ln(classes) less the smaller of these margins (the module's docstring).
MARGIN_SHARE = 0.1
MARGIN_PER_CLASS = MARGIN_SHARE * math.log(10) / 9  # 0.0256 nats: the two meet at 10 classes
EXPLODED = 10.0
STALL_EPOCHS = 0.5
STALL_STEPS = 100


@dataclass(frozen=True)
class LossHistory:
    """What every worker knows of the run's loss, the same on each: the first step's loss
    averaged over the workers, and the highest and lowest window means so far."""

    first: float
    highest: float
    lowest: float


def reference_loss(first_loss: float, classes: int) -> float:
    """Where training started, `first_loss`, but at least ln(classes)."""
    return max(first_loss, math.log(classes)) if classes > 1 else first_loss


def left_guessing(classes: int) -> float:
    """The loss a window must come below to show the network predicts better than
    chance: ln(classes) less a margin for a dead network's noise (2.07 at 10 classes,
    0.668 at 2)."""
    guessing = math.log(classes)
    return guessing - min(MARGIN_SHARE * guessing, MARGIN_PER_CLASS * (classes - 1))


def reason_to_stop(window_mean: float, history: LossHistory, classes: int,
                   after_warmup: bool, steps: int = WINDOW,
                   stall_judged: bool = False) -> str | None:
    """Why the run has diverged, or None (the rules are in this module's docstring).
    `stall_judged`: STALL_EPOCHS and STALL_STEPS have passed since warmup and since the
    start, and the data can be learnt."""
    if not math.isfinite(window_mean):
        return f"the training loss averaged over the last {steps} steps is {window_mean}"
    reference = reference_loss(history.first, classes)
    limit = FACTOR if after_warmup else EXPLODED
    if window_mean > limit * reference:
        return (f"the training loss averaged over the last {steps} steps, "
                f"{window_mean:.3g}, is above {limit:g} times where training started, "
                f"{reference:.3g}")
    if not after_warmup:
        return None
    # A network that died predicts by its biases: the loss of guessing.
    bar = left_guessing(classes) if classes > 1 else (1 - MARGIN_SHARE) * reference
    if history.highest > FACTOR * reference and window_mean > bar:
        return (f"the training loss rose to {history.highest:.3g} (a mean over {WINDOW} "
                f"steps), above {FACTOR:g} times where training started, {reference:.3g}, "
                f"and has not come back down: {window_mean:.3g} over the last {steps} steps")
    if stall_judged and classes > 1 and history.lowest > bar:
        return (f"the training loss has never come below {bar:.3g}, ln({classes}) less "
                f"{math.log(classes) - bar:.2g} (guessing scores {math.log(classes):.3g}): its "
                f"lowest mean over {WINDOW} steps is {history.lowest:.3g}, so the network "
                f"predicts no better than chance (a rate far too high kills it, one far too "
                f"low has not started it)")
    return None


def shares(own_first: float | None, agreed: LossHistory | None, window_sum: float,
           window_steps: int) -> dict[str, float]:
    """One worker's part of the average over the workers that `agree` reads: its window,
    and the history it agreed on at an earlier check, or else its own first step's loss
    (a worker that joined an elastic job has none agreed, and its first loss is not the
    run's)."""
    has_own = agreed is None and own_first is not None
    return {"sum": window_sum, "steps": float(window_steps),
            "agreed_first": agreed.first if agreed else 0.0,
            "agreed_highest": agreed.highest if agreed else 0.0,
            "agreed_lowest": agreed.lowest if agreed else 0.0,
            "has_agreed": float(agreed is not None),
            "first": own_first if has_own else 0.0, "has_first": float(has_own)}


def agree(mean: Mapping[str, float]) -> tuple[float, LossHistory] | None:
    """From the workers' average of `shares`: the window's mean loss and the history
    with it, the same on every worker; None if no worker has trained a step since the
    last check. The history is the one agreed earlier if any worker holds it, else the
    run's first check's (each worker's own first step, averaged)."""
    if mean["steps"] == 0:
        return None
    window_mean = mean["sum"] / mean["steps"]
    if mean["has_agreed"] > 0:
        first = mean["agreed_first"] / mean["has_agreed"]
        highest = max(mean["agreed_highest"] / mean["has_agreed"], window_mean)
        lowest = min(mean["agreed_lowest"] / mean["has_agreed"], window_mean)
    else:
        first, highest = mean["first"] / mean["has_first"], window_mean
        lowest = window_mean
    return window_mean, LossHistory(first, highest, lowest)


def divergence_message(reason: str, step: int, peak_lr: float | None,
                       global_batch: int, lamb: bool = False) -> str:
    """The one line a diverged run ends with: where, at what rate, and what to try. The
    cap it suggests is a quarter of the peak: LeNet's 0.4 at a global batch of 1024
    diverged, half of it too, a quarter trained. LAMB at its cap trained there at every seed,
    above SGD; LARS trained below it at every peak tried (BENCHMARKS.md, "LARS and LAMB").
    `lamb`: the run's optimizer is LAMB already, so it is not suggested."""
    peak = f"peak learning rate {peak_lr:.4g}" if peak_lr is not None else "its learning rate"
    cap = f"--max-lr {peak_lr / 4:.3g}" if peak_lr is not None else "--max-lr"
    other = "" if lamb else (f", --optimizer lamb (its peak is capped at "
                             f"{DEFAULT_MAX_LR['lamb']:g})")
    return (f"training diverged at step {step}: {reason} ({peak} for a global batch of "
            f"{global_batch}); try --lr-scaling sqrt, {cap}{other}, or a lower --base-lr "
            f"(--no-divergence-guard lets it go on)")
