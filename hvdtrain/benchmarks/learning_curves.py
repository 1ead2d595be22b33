"""`hvdtrain plot`: training-error and test-accuracy curves of runs.

Reads each run folder's steps.jsonl (every step's minibatch error) and config.yaml,
smooths the error with a sliding mean over `window` minibatches (the paper used
400), and draws it against steps, against wall time and against the examples all
workers trained on (the paper's epochs). Cold, warm (synchronous) and
single (one-worker) starts get a panel each; a one-worker run, which has no local
phase, appears in every panel as the reference. Test accuracy is drawn against wall
time, one line per run, from the evaluations `--eval-every` logs and the final one
(`hvdtrain.benchmarks.time_to_accuracy`). Every PNG comes with the CSV table it was
drawn from. A run a sweep recorded as diverged (`hvdtrain.benchmarks.diverged_runs`) is
drawn up to its last logged step and labelled so; steps.jsonl is written at epoch ends,
so one that diverged in its first epoch has no curve and is left out, with a note.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

from hvdtrain.benchmarks.diverged_runs import described, read_marker
from hvdtrain.benchmarks.time_to_accuracy import accuracy_rows, draw_accuracy, load_points
from hvdtrain.errors import ConfigError, DataError
from hvdtrain.rounds.periods import LOCAL_MODES, period_label
from hvdtrain.stats import sliding_mean
from hvdtrain import files
from hvdtrain.training import run_folder

PAPER_WINDOW = 400
MAX_POINTS = 500  # per run in the CSV tables and plots; the curves are smooth by then
# How a run starts, by its sweep name, and the `--warm-start` of the named warm starts.
WARM_START_OF = {"warm": "sync", "single": "single"}
STARTS = ("cold", *WARM_START_OF)
PANEL_TITLES = {"cold": "cold start", "warm": "warm start: synchronous steps first",
                "single": "warm start: one worker's steps first"}
# Paine et al. plot against time and against epochs: the examples all workers trained
# on, which more workers gather faster per step.
AXES = {"steps": ("step", "training step (minibatches per worker)"),
        "time": ("wall_seconds", "wall time (seconds)"),
        "examples": ("examples", "training examples, all workers together")}
AXIS_TITLES = {"steps": "steps", "time": "wall time", "examples": "examples trained on"}


@dataclass
class Curve:
    """One run's per-step training error and what the run was."""

    name: str
    workers: int
    mode: str
    n_sync: int | str  # or "auto"
    warm_start_steps: int
    warm_start: str = "sync"
    hierarchical: bool = False  # --hierarchical-sgd: a host's workers average every step
    diverged: str = ""  # "diverged at step N" for a run a sweep recorded as diverged
    step: list[int] = field(default_factory=list)
    wall_seconds: list[float] = field(default_factory=list)
    error: list[float] = field(default_factory=list)
    # The examples all workers had trained on after each step, as steps.jsonl counts them
    # (a warm start's and an elastic resize's included); empty where it does not.
    examples: list[int] = field(default_factory=list)

    @property
    def start(self) -> str:
        """The sweep's name for how the run started: cold, warm or single."""
        if self.warm_start_steps == 0:
            return "cold"
        return next(start for start, kind in WARM_START_OF.items() if kind == self.warm_start)

    @property
    def label(self) -> str:
        if self.workers == 1:
            return f"1 worker ({self.diverged})" if self.diverged else "1 worker"
        what = {"local": f"n_sync {self.n_sync}", "async": f"async, n_sync {self.n_sync}"}.get(
            self.mode, "sync")
        # Flat and hierarchical runs of one period sit side by side in a sweep's plots.
        label = f"{self.workers} workers, {'hierarchical, ' if self.hierarchical else ''}{what}"
        return f"{label} ({self.diverged})" if self.diverged else label

    @property
    def long_label(self) -> str:
        """The label, and how the run started when that was not cold."""
        return self.label if self.start == "cold" else f"{self.label}, {self.start} start"


def load_curve(run_dir: str) -> Curve:
    """A run folder's curve; DataError naming the folder if it has none."""
    steps_path = os.path.join(run_dir, run_folder.STEPS)
    config_path = os.path.join(run_dir, run_folder.CONFIG)
    if not os.path.isfile(steps_path) or not os.path.isfile(config_path):
        raise DataError(f"{run_dir} is not an hvdtrain run folder with {run_folder.STEPS} "
                        f"and {run_folder.CONFIG}")
    config = run_folder.saved_config(run_dir)
    summary_path = os.path.join(run_dir, run_folder.SUMMARY)
    summary = files.read_json(summary_path) if os.path.isfile(summary_path) else {}
    # A run still going, or stopped, has no summary: the workers of its last epoch.
    workers = summary.get("workers") or \
        _last_record(os.path.join(run_dir, run_folder.METRICS)).get("workers", 1)
    local = config.get("mode") in LOCAL_MODES
    # Sync runs save no period: 1. An N/hosts period needs the summary's host count.
    period = period_label(config.get("n_sync") or 1, int(workers), int(summary.get("hosts", 1)))
    marker = read_marker(run_dir)
    curve = Curve(os.path.basename(os.path.normpath(run_dir)), int(workers),
                  config.get("mode", "sync"), period,
                  int(config.get("warm_start_steps", 0)) if local else 0,
                  str(config.get("warm_start", "sync")), bool(config.get("hierarchical_sgd")),
                  described(marker.get("step")) if marker else "")
    # An elastic job that lost a worker right after writing some steps runs them again:
    # the later record of a step wins.
    by_step: dict[int, tuple[float, float, int | None]] = {}
    with open(steps_path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if record.get("rank", 0) != 0:
                continue  # --sync-seconds logs each worker's own steps: rank 0's make the curve
            by_step[int(record["step"])] = (float(record["wall_seconds"]), float(record["error"]),
                                            record.get("examples"))
    for step in sorted(by_step):
        curve.step.append(step)
        curve.wall_seconds.append(by_step[step][0])
        curve.error.append(by_step[step][1])
        curve.examples.append(by_step[step][2])
    if None in curve.examples:
        curve.examples = []
    if not curve.step:
        raise DataError(f"{steps_path} holds no steps")
    return curve


def _last_record(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}


def run_folders(paths: list[str]) -> list[str]:
    """The run folders named, with a sweep folder standing for every run in its runs/."""
    folders = []
    for path in paths:
        runs = os.path.join(path, "runs")
        if os.path.isdir(runs) and not os.path.isfile(os.path.join(path, run_folder.STEPS)):
            folders += sorted(os.path.join(runs, name) for name in os.listdir(runs)
                              if os.path.isdir(os.path.join(runs, name)))
        elif os.path.isdir(path):
            folders.append(path)
        else:
            raise DataError(f"run folder not found: {path}")
    if not folders:
        raise DataError(f"no run folders in {', '.join(paths)}")
    return folders


def thinned(count: int, max_points: int = MAX_POINTS) -> list[int]:
    """Evenly spread indices into a series of `count`, the last one always kept."""
    if count <= max_points:
        return list(range(count))
    stride = count / max_points
    return sorted({int(i * stride) for i in range(max_points)} | {count - 1})


def panels(curves: list[Curve]) -> list[tuple[str, list[Curve]]]:
    """(title, curves) per panel: each kind of start apart when there are several."""
    present = {c.start for c in curves if c.workers > 1}
    if len(present) < 2:
        return [("", curves)]
    return [(PANEL_TITLES[start], [c for c in curves if c.workers == 1 or c.start == start])
            for start in STARTS if start in present]


def smoothed_rows(curves: list[Curve], window: int, axis: str) -> list[dict]:
    """The table behind one plot: each run's smoothed error at thinned points along `axis`."""
    key = AXES[axis][0]
    rows = []
    for curve in curves:
        smooth = sliding_mean(curve.error, window)
        xs = getattr(curve, key)
        for i in thinned(len(smooth)):
            rows.append({"run": curve.name, "label": curve.label, "workers": curve.workers,
                         "n_sync": curve.n_sync if curve.mode in LOCAL_MODES else "",
                         "start": curve.start, key: xs[i], "smoothed_error": round(smooth[i], 6)})
    return rows


def _sort_key(curve: Curve):
    # Numbers before words (auto), so the periods sort without comparing the two.
    period = (0, curve.n_sync, "") if isinstance(curve.n_sync, int) else (1, 0, curve.n_sync)
    return (curve.workers, curve.mode != "sync", period, curve.mode == "async",
            STARTS.index(curve.start))


def draw(curves: list[Curve], window: int, axis: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, xlabel = AXES[axis]
    groups = panels(sorted(curves, key=_sort_key))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.4 * len(groups), 4.6), sharey=True,
                             squeeze=False)
    colors = {}
    for ax, (title, members) in zip(axes[0], groups):
        for curve in members:
            rows = smoothed_rows([curve], window, axis)
            color = colors.setdefault(curve.label, f"C{len(colors) % 10}")
            ax.plot([r[key] for r in rows], [r["smoothed_error"] for r in rows],
                    label=curve.label, color=color,
                    linestyle="--" if curve.workers == 1 else "-", linewidth=1.4)
        ax.set_xlabel(xlabel)
        ax.set_title(title or f"training error, {window}-minibatch sliding mean")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"training error ({window}-minibatch sliding mean)")
    if len(groups) > 1:
        fig.suptitle(f"Training error against {AXIS_TITLES[axis]}")
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def plot_accuracy(curves: list[Curve], folders: list[str], out: str,
                  target: float | None = None) -> list[str]:
    """Test accuracy against wall time, one line per run; returns the files written."""
    by_name = {os.path.basename(os.path.normpath(f)): f for f in folders}
    lines = {c.long_label: load_points(by_name[c.name]) for c in sorted(curves, key=_sort_key)}
    lines = {label: points for label, points in lines.items() if points}
    if not lines:
        return []
    stem = os.path.join(out, "test_accuracy_vs_time")
    files.write_csv(stem + ".csv", accuracy_rows(lines))
    draw_accuracy(lines, stem + ".png", target)
    return [stem + ".png", stem + ".csv"]


def plot_runs(folders: list[str], out: str, window: int = PAPER_WINDOW,
              target: float | None = None) -> list[str]:
    """The plots and their tables for these run folders; returns the files written."""
    if window <= 0:
        raise ConfigError(f"--window must be a positive number of minibatches, got {window}")
    curves = _curves(folders)
    if not curves:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    for axis in AXES:
        if axis == "examples" and not all(c.examples for c in curves):
            continue  # run folders from before steps.jsonl counted the examples
        stem = os.path.join(out, f"training_error_vs_{axis}")
        files.write_csv(stem + ".csv", smoothed_rows(sorted(curves, key=_sort_key), window, axis))
        draw(curves, window, axis, stem + ".png")
        written += [stem + ".png", stem + ".csv"]
    return written + plot_accuracy(curves, folders, out, target)


def _curves(folders: list[str]) -> list[Curve]:
    """The folders' curves, less those of runs that diverged before they logged a step
    (each named in a note); any other folder without steps is an error."""
    curves = []
    for folder in folders:
        try:
            curves.append(load_curve(folder))
        except DataError:
            marker = read_marker(folder)
            if marker is None:
                raise
            print(f"hvdtrain: note: {os.path.basename(os.path.normpath(folder))} "
                  f"{described(marker.get('step'))} before its first logged step (steps.jsonl "
                  f"is written at epoch ends); left out of the plots", flush=True)
    return curves


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "plot", help="training-error curves of runs or a sweep, as PNG and CSV",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_SWEEP",
                        help="run folders of hvdtrain train, or sweep folders (all their runs)")
    parser.add_argument("--window", type=int, default=PAPER_WINDOW,
                        help=f"sliding-mean window in minibatches (default: {PAPER_WINDOW}, "
                             "as in Paine et al. 2013)")
    parser.add_argument("--out", default=None,
                        help="folder for the PNG and CSV files (default: the first folder given)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    written = plot_runs(run_folders(args.runs), args.out or args.runs[0], args.window)
    if not written:
        raise DataError(f"no run in {', '.join(args.runs)} logged a step to plot")
    print("hvdtrain: wrote " + ", ".join(written), flush=True)
    return 0
