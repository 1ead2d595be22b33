"""Summary statistics for measurements (pure)."""

from __future__ import annotations

import math
from typing import Sequence

# Two-sided 95% Student t quantiles for 1..30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_ci95(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (0 for one sample)."""
    n = len(samples)
    if n == 0:
        raise ValueError("no samples")
    mean = sum(samples) / n
    if n == 1:
        return mean, 0.0
    variance = sum((x - mean) ** 2 for x in samples) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return mean, t * math.sqrt(variance / n)


def per_batch_values(running_means: Sequence[float]) -> list[float]:
    """Each batch's own value from the running means Keras reports after every batch.

    Keras logs, after batch b of an epoch, the mean over batches 1..b (weighted by
    batch size, which is constant within a run), so batch b's value is
    b·m_b − (b − 1)·m_(b−1).
    """
    values, previous_total = [], 0.0
    for count, mean in enumerate(running_means, start=1):
        total = count * mean
        values.append(total - previous_total)
        previous_total = total
    return values


def sliding_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last `window` values at every position (fewer at the start)."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    means, running = [], 0.0
    for i, value in enumerate(values):
        running += value
        if i >= window:
            running -= values[i - window]
        means.append(running / min(i + 1, window))
    return means
