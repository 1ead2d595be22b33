"""Time to accuracy: how long, how many examples and how many bytes a run needed to first
reach a target test accuracy, and its test accuracy against wall time.

A run's points are the evaluations within epochs that `--eval-every` writes to
metrics.jsonl (`"eval": true`), then the final evaluation in summary.json. Time is
`train_seconds`: wall time the run trained, less the time spent evaluating, so
evaluating more often does not make a run look slower; a resumed run's counts what it
trained before its stop. The same for every run, as
DAWNBench and MLPerf report the time to a fixed target rather than a throughput.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Iterable

from hvdtrain import files
from hvdtrain.training import run_folder


@dataclass(frozen=True)
class AccuracyPoint:
    """One evaluation of the consensus model."""

    train_seconds: float
    examples: int
    bytes_allreduced: int
    test_accuracy: float


def accuracy_points(metrics_lines: list[dict], summary: dict | None) -> list[AccuracyPoint]:
    """The run's evaluations in the order they happened, the final one last (if finished)."""
    points = [AccuracyPoint(float(r["train_seconds"]), int(r["examples"]),
                            int(r["bytes_allreduced"]), float(r["test_accuracy"]))
              for r in metrics_lines if r.get("eval")]
    if summary is not None and "test_accuracy" in summary:
        points.append(AccuracyPoint(
            trained_seconds(summary),
            int(summary["examples_trained"]), int(summary["bytes_allreduced"]),
            float(summary["test_accuracy"])))
    return points


def trained_seconds(summary: dict) -> float:
    """The run's training seconds, every process's, from its summary.json; a summary
    written before it kept them gave its wall time, its clock moved back at a resume by
    the seconds trained before, with its evaluations in it."""
    if "train_seconds" in summary:
        return float(summary["train_seconds"])
    return float(summary["wall_seconds"]) - float(summary.get("eval_seconds", 0.0))


def first_reaching(points: list[AccuracyPoint], target: float) -> AccuracyPoint | None:
    """The first point at or above `target`, or None if the run never got there."""
    return next((p for p in points if p.test_accuracy >= target), None)


def target_row(points: list[AccuracyPoint], target: float | None) -> dict:
    """What the sweep's table reports about reaching `target` (blanks when not reached)."""
    reached = first_reaching(points, target) if target is not None else None
    return {"target": target if target is not None else "",
            "seconds_to_target": reached.train_seconds if reached else "",
            "examples_to_target": reached.examples if reached else "",
            "bytes_to_target": reached.bytes_allreduced if reached else ""}


def default_targets(finals: dict[tuple[int, str], float],
                    counts: Iterable[int] = ()) -> dict[int, float]:
    """Per worker count, sync's final accuracy minus one point: from the synchronous run
    with that many workers, else from the one-worker run. `finals` maps (workers, mode)
    to a run's final accuracy; `counts` are more worker counts to cover, those whose runs
    have no final accuracy of their own there."""
    one_worker = next((acc for (workers, _), acc in finals.items() if workers == 1), None)
    targets = {}
    for workers in {w for w, _ in finals} | set(counts):
        reference = finals.get((workers, "sync"), one_worker)
        if reference is not None:
            targets[workers] = reference - 0.01
    return targets


def load_points(run_dir: str) -> list[AccuracyPoint]:
    """A run folder's points; a line cut short by a crash is skipped."""
    lines = []
    path = os.path.join(run_dir, run_folder.METRICS)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue
    summary_path = os.path.join(run_dir, run_folder.SUMMARY)
    summary = files.read_json(summary_path) if os.path.isfile(summary_path) else None
    return accuracy_points(lines, summary)


def accuracy_rows(curves: dict[str, list[AccuracyPoint]]) -> list[dict]:
    """The table behind the plot: every point of every run, labelled."""
    return [{"label": label, **asdict(point)}
            for label, points in curves.items() for point in points]


def draw_accuracy(curves: dict[str, list[AccuracyPoint]], path: str,
                  target: float | None = None) -> None:
    """Test accuracy against training wall time, one line per run (label -> points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    for i, (label, points) in enumerate(curves.items()):
        ax.plot([p.train_seconds for p in points], [p.test_accuracy for p in points],
                marker=".", label=label, color=f"C{i % 10}", linewidth=1.4)
    if target is not None:
        ax.axhline(target, color="grey", linestyle=":", linewidth=1,
                   label=f"target {target:.2%}")
    ax.set_xlabel("training wall time (seconds, evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Test accuracy against wall time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
