"""`hvdtrain sweep --seeds`: every setting once per seed, and what the seeds say about it.

A setting is a run of the grid with everything but the seed (workers, mode, n_sync,
start). One run's accuracy carries the noise of its initial weights, shuffles and
dropout; the differences the sweeps measure (sync 2.9 points behind local SGD at a
global batch of 512) need the spread over seeds to be read: the mean test accuracy,
and the half-width of its 95% interval from Student's t (`hvdtrain.stats.mean_ci95`).
A run the divergence guard stopped has no accuracy to average: the setting counts it as
diverged, and its mean and interval are over the runs that finished. Chance accuracy in
its place would drag the mean down by tens of points and widen the interval past
reading; leaving it out unmarked would make a setting that diverges at one seed in three
look as sound as one that never does. The count says which it is.
"""

from __future__ import annotations

import argparse

from hvdtrain.benchmarks.diverged_runs import is_diverged
from hvdtrain.errors import ConfigError
from hvdtrain.stats import mean_ci95

SETTING_COLUMNS = ("setting", "workers", "mode", "n_sync", "start", "seeds", "runs", "diverged",
                   "test_accuracy_mean", "test_accuracy_ci95", "target", "reached_target",
                   "seconds_to_target_mean", "seconds_to_target_ci95")


def add_seeds_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", default=None,
                        help="run every setting once per seed (1,2,3), each with --seed N, "
                             "named <setting>-sN; a second table (sweep-settings.csv, "
                             "\"settings\" in sweep.json) gives each setting's mean test "
                             "accuracy over the seeds and its 95%% interval (Student's t), "
                             "and the mean seconds to --target of the runs that reached it; "
                             "a seed whose run diverged is counted in its \"diverged\" "
                             "column, not averaged: the mean and interval are over the "
                             "runs that finished, blank if none did "
                             "(default: one run per setting, with --seed)")


def parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]: distinct non-negative integers, as --seed takes."""
    try:
        seeds = [int(part) for part in str(text).split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must be distinct non-negative integers separated by "
                          f"commas, got {text!r}")
    return seeds


def seed_suffix(seed: int | None) -> str:
    """What a run's name adds for its seed: '-s2', nothing without --seeds."""
    return "" if seed is None else f"-s{seed}"


def summarize_seeds(rows: list[dict]) -> list[dict]:
    """One row per setting, in the order of its first run: its seeds, how many of its
    runs diverged, and the mean test accuracy of the others with the half-width of its
    95% interval (0 for one run; both blank when every run diverged); and, where the
    sweep had a target, how many runs reached it and their mean training seconds to it."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["setting"], []).append(row)
    settings = []
    for setting, runs in groups.items():
        finished = [run["test_accuracy"] for run in runs if not is_diverged(run)]
        mean, half_width = mean_ci95(finished) if finished else ("", "")
        first = runs[0]
        settings.append({
            "setting": setting, "workers": first["workers"], "mode": first["mode"],
            "n_sync": first["n_sync"], "start": first["start"],
            "seeds": " ".join(str(run["seed"]) for run in runs), "runs": len(runs),
            "diverged": len(runs) - len(finished),
            "test_accuracy_mean": mean, "test_accuracy_ci95": half_width,
            **_time_to_target(runs)})
    return settings


def _time_to_target(runs: list[dict]) -> dict:
    """The setting's runs against the sweep's target: how many reached it, and the mean
    seconds of those that did with its 95% half-width. A run that never reached it has no
    time to average, as a diverged one has no accuracy: the count says how many."""
    target = runs[0].get("target", "")
    seconds = [run["seconds_to_target"] for run in runs if run.get("seconds_to_target", "") != ""]
    mean, half_width = mean_ci95(seconds) if seconds else ("", "")
    return {"target": target, "reached_target": len(seconds) if target != "" else "",
            "seconds_to_target_mean": mean, "seconds_to_target_ci95": half_width}


def format_settings_table(settings: list[dict]) -> str:
    """The settings as a Markdown table: mean test accuracy ± its 95% interval, and how
    many runs diverged where any did; the mean seconds to the target and how many runs
    reached it."""
    lines = ["| setting | workers | n_sync | start | seeds | test accuracy (mean ± 95% CI) | "
             "s to target (mean ± 95% CI) |", "|" + "---|" * 7]
    for s in settings:
        lines.append(f"| {s['setting']} | {s['workers']} | {s['n_sync'] or '–'} | {s['start']} | "
                     f"{s['seeds']} | {_accuracy_cell(s)} | {_target_cell(s)} |")
    return "\n".join(lines)


def _target_cell(s: dict) -> str:
    reached, runs = s.get("reached_target", ""), s["runs"]
    if reached == "":
        return "–"
    if reached == 0:
        return f"none of {runs} reached {s['target']:.2%}"
    cell = f"{s['seconds_to_target_mean']:.0f} ± {s['seconds_to_target_ci95']:.0f}"
    return cell if reached == runs else f"{cell} ({reached} of {runs} reached it)"


def _accuracy_cell(s: dict) -> str:
    diverged, runs = s.get("diverged", 0), s["runs"]
    if diverged == runs:
        return "diverged" if runs == 1 else f"all {runs} diverged"
    cell = f"{s['test_accuracy_mean']:.2%} ± {s['test_accuracy_ci95']:.2%}"
    if diverged:
        cell += f" ({diverged} of {runs} diverged; mean of the {runs - diverged} that finished)"
    return cell
