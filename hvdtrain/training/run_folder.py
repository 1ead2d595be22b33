"""The run folder and its files; written by rank 0 only, every file atomically.

Every file is written through `hvdtrain.files`, so a crash never leaves a
half-written config, summary or log.
"""

from __future__ import annotations

import json
import os
import time

from hvdtrain.files import atomic_write

CONFIG = "config.yaml"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
FINAL_WEIGHTS = "model.weights.h5"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"


def default_run_dir(model: str, mode: str, root: str = "runs") -> str:
    return os.path.join(root, f"{time.strftime('%Y%m%d-%H%M%S')}-{model}-{mode}")


def records_up_to(lines: list[str], examples: int) -> list[str]:
    """The JSON lines whose job-wide `examples` count is at most `examples`.

    The examples, not the step, place a record against a checkpoint: with rounds every
    T seconds a step-log line counts its own worker's steps, which run ahead of the
    job's step on a fast worker and behind it on a slow one. A worker's count of the
    job's examples never exceeds the true count, and after the checkpoint it exceeds
    the checkpoint's, so the cut keeps exactly what was written before it. A line cut
    short by a crash is dropped; one without a count (older logs) is kept.
    """
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("examples", 0) <= examples:
                keep.append(line)
        except ValueError:
            pass
    return keep


def truncate_logs(run_dir: str, examples: int) -> None:
    """Drop the epoch and step records written after a checkpoint at `examples` of the
    job: the resumed run writes them again."""
    for log in (METRICS, STEPS):
        _truncate(os.path.join(run_dir, log), examples)


def _truncate(path: str, examples: int) -> None:
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    keep = records_up_to(lines, examples)
    if len(keep) != len(lines):
        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(keep)
        atomic_write(path, write)


def existing_run_problem(run_dir: str) -> str | None:
    """Why `run_dir` cannot take a new run, or None."""
    if os.path.exists(os.path.join(run_dir, CONFIG)):
        return f"run folder {run_dir} already holds a run; choose a new --out"
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        return f"--out {run_dir} exists and is not a folder"
    return None
