"""The arithmetic of throughput benchmarks (pure): rates with intervals, scaling, overhead."""

from __future__ import annotations

import math
from typing import Sequence

from hvdtrain.rounds.averaging import is_local_sync_step
from hvdtrain.config import LOCAL_MODES
from hvdtrain.stats import mean_ci95


def window_rates(step_seconds: Sequence[float], window: int, images_per_step: int) -> list[float]:
    """Images/sec in consecutive windows of `window` steps (a short last window is dropped
    unless it is the only one)."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    starts = range(0, max(len(step_seconds) - window, 0) + 1, window)
    return [len(chunk) * images_per_step / sum(chunk)
            for chunk in (step_seconds[i:i + window] for i in starts) if sum(chunk) > 0]


def worker_throughput(step_seconds_by_worker: Sequence[Sequence[float]], window: int,
                      images_per_step: int) -> dict[str, float]:
    """Per-worker and total images/sec, each with the half-width of a 95% interval.

    Point estimates are images over time for the whole timed stretch (so a local-SGD
    round counts in proportion); the intervals come from the spread of the window
    rates (batch means). The total is the sum of the workers' rates, which are kept in
    rank order as `worker_images_per_sec`.
    """
    workers = len(step_seconds_by_worker)
    per_worker_rates = [len(s) * images_per_step / sum(s) for s in step_seconds_by_worker]
    windows = [window_rates(s, window, images_per_step) for s in step_seconds_by_worker]
    count = min(len(w) for w in windows)
    window_totals = [sum(w[i] for w in windows) for i in range(count)]
    _, total_ci = mean_ci95(window_totals)
    total = sum(per_worker_rates)
    return {
        "per_worker_images_per_sec": total / workers,
        "per_worker_ci95": total_ci / workers,
        "total_images_per_sec": total,
        "total_ci95": total_ci,
        "worker_images_per_sec": per_worker_rates,
        "step_seconds": sum(map(sum, step_seconds_by_worker)) / sum(map(len, step_seconds_by_worker)),
    }


def rounded_steps(steps: int, n_sync: int | None) -> int:
    """Timed steps for local SGD: whole periods of n_sync, so each round counts in proportion."""
    if not n_sync:
        return steps
    return math.ceil(steps / n_sync) * n_sync


def exchanges_in(mode: str, first_step: int, steps: int, n_sync: int | None, workers: int) -> int:
    """Allreduce rounds among steps first_step..first_step+steps-1 (1-based): every step in
    sync mode, every n_sync-th in local and async mode, none when working independently or
    alone."""
    if workers == 1 or mode == "independent":
        return 0
    if mode in LOCAL_MODES:
        return sum(is_local_sync_step(s, n_sync) for s in range(first_step, first_step + steps))
    return steps


def communication_share(seconds_per_exchange: float, exchanges: int, steps: int,
                        step_seconds: float) -> float:
    """Fraction of the mean step time that the timed allreduce rounds account for."""
    if exchanges == 0 or step_seconds <= 0:
        return 0.0
    return min(1.0, seconds_per_exchange * exchanges / steps / step_seconds)


def add_scaling(rows: list[dict]) -> list[dict]:
    """Speed-up and efficiency of each row against the fewest workers of the same setup.

    Rows with the same model, batch and mode form one series; efficiency is the
    speed-up divided by the growth in workers (1.0 is perfect linear scaling).
    """
    def series(row):
        return (row["model"], row["batch_per_worker"], row["mode"], row.get("n_sync"),
                row.get("sync_seconds"))

    smallest: dict[tuple, dict] = {}
    for row in rows:
        key = series(row)
        if key not in smallest or row["workers"] < smallest[key]["workers"]:
            smallest[key] = row
    for row in rows:
        base = smallest[series(row)]
        row["speedup"] = row["total_images_per_sec"] / base["total_images_per_sec"]
        row["efficiency"] = row["speedup"] / (row["workers"] / base["workers"])
    return rows


def overhead_against_reference(rows: list[dict], mode: str = "sync",
                               reference: str = "horovod") -> dict[int, tuple[float, float]]:
    """Per worker count: reference images/sec over hvdtrain's, minus one, with the
    half-width of its 95% interval.

    0.02 means the plain Horovod script trained 2% faster than hvdtrain in `mode`;
    a negative value means hvdtrain was faster. Repeats taken in turn are compared in
    pairs, which cancels the machine's slow and fast spells.
    """
    by_workers: dict[int, dict[str, dict]] = {}
    for row in rows:
        # Sync rows of other gradient groups (bench --bucket-mb a,b) carry labels of their
        # own; the default's is the mode's name.
        if row["mode"] in (mode, reference) and row.get("label", row["mode"]) == row["mode"]:
            by_workers.setdefault(row["workers"], {})[row["mode"]] = row
    result = {}
    for workers, pair in sorted(by_workers.items()):
        if len(pair) < 2:
            continue
        ours = pair[mode].get("repeat_images_per_sec", [pair[mode]["total_images_per_sec"]])
        theirs = pair[reference].get("repeat_images_per_sec",
                                     [pair[reference]["total_images_per_sec"]])
        result[workers] = mean_ci95([t / o - 1.0 for t, o in zip(theirs, ours)])
    return result


def ratios_to_reference(rows: list[dict], mode: str = "sync",
                        reference: str = "horovod") -> dict[tuple[int, str], tuple[float, float]]:
    """Per worker count and `mode` setup (each --bucket-mb of sync): its images/sec over the
    reference's, paired repeat by repeat, with the half-width of the 95% interval."""
    references = {r["workers"]: r for r in rows if r["mode"] == reference}
    result = {}
    for row in rows:
        theirs = references.get(row["workers"])
        if row["mode"] != mode or theirs is None:
            continue
        ours = row.get("repeat_images_per_sec", [row["total_images_per_sec"]])
        base = theirs.get("repeat_images_per_sec", [theirs["total_images_per_sec"]])
        result[(row["workers"], row.get("label", mode))] = mean_ci95(
            [o / t for o, t in zip(ours, base)])
    return result


def combine_repeats(rows: list[dict]) -> dict:
    """One row from several measurements of the same setup.

    Rates are the mean over repeats and the intervals come from the spread between
    repeats, which (unlike windows within one run) also covers drift of the machine.
    A single measurement is returned as it is, with its window-based intervals.
    """
    if len(rows) == 1:
        return dict(rows[0], repeats=1)
    totals = [r["total_images_per_sec"] for r in rows]
    total, total_ci = mean_ci95(totals)
    workers = rows[0]["workers"]
    averaged = {key: sum(r[key] for r in rows) / len(rows)
                for key in ("step_seconds", "seconds_per_exchange", "communication_share",
                            "round_share") if key in rows[0]}
    for key in ("worker_images_per_sec", "worker_timed_steps"):
        if key in rows[0]:
            averaged[key] = [sum(values) / len(rows) for values in zip(*(r[key] for r in rows))]
    return dict(rows[0], **averaged, repeats=len(rows), repeat_images_per_sec=totals,
                total_images_per_sec=total, total_ci95=total_ci,
                per_worker_images_per_sec=total / workers, per_worker_ci95=total_ci / workers)
