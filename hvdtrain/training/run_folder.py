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


def truncate_metrics(path: str, last_step: int) -> None:
    """Drop records (epochs or steps) past `last_step`: a resumed run writes them again."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= last_step:
                keep.append(line)
        except ValueError:
            pass  # a line cut short by a crash
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
