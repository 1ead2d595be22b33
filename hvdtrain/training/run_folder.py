"""The run folder and its files; written by rank 0 only, every file atomically.

Every file is written through `hvdtrain.files`, so a crash never leaves a
half-written config, summary or log.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from functools import partial
from typing import Any, Callable, Iterator

import yaml

from hvdtrain.errors import RunFolderError
from hvdtrain.files import atomic_write

CONFIG = "config.yaml"
PLAN = "plan.json"      # the run's settled plan (hvdtrain.plan), rewritten at each start
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
FINAL_WEIGHTS = "model.weights.h5"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"


def holds_checkpoint(checkpoints: str, path: str) -> bool:
    """Whether the checkpoint folder `path` is one of the folder `checkpoints`' own (a
    run's `CHECKPOINTS`), whatever links or relative names lead to either."""
    return os.path.realpath(os.path.dirname(os.path.normpath(path))) == \
        os.path.realpath(checkpoints)


def saved_config(run_dir: str) -> dict[str, Any]:
    """The options the run saved in its config.yaml, as written ({} where it saved none).
    Read as plain YAML, not as a TrainConfig, so that a folder from an older version whose
    options have since changed still reads."""
    path = os.path.join(run_dir, CONFIG)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


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
    return [line for line in lines if _written_by(line, examples)]


def _written_by(line: str, examples: int) -> bool:
    try:
        return json.loads(line).get("examples", 0) <= examples
    except ValueError:
        return False


def truncate_logs(run_dir: str, examples: int) -> None:
    """Drop the epoch and step records written after a checkpoint at `examples` of the
    job: the resumed run writes them again."""
    for log in (METRICS, STEPS):
        _truncate(os.path.join(run_dir, log), examples)


def copy_cut_lines(run_dir: str, examples: int, folder: str) -> list[str]:
    """Copy the lines of the epoch and step logs that `truncate_logs(run_dir, examples)`
    will drop into `folder`, under the logs' own names: an abandoned branch keeps its
    records with its checkpoints. Returns the names of the logs copied."""
    copied = []
    for log in (METRICS, STEPS):
        cut = [line for line in _lines(os.path.join(run_dir, log))
               if not _written_by(line, examples)]
        if cut:
            _write_lines(os.path.join(folder, log), cut)
            copied.append(log)
    return copied


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [line for line in fh if line.strip()]


def _write_lines(path: str, lines: list[str]) -> None:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(lines)
    atomic_write(path, write)


def _truncate(path: str, examples: int) -> None:
    lines = _lines(path)
    keep = records_up_to(lines, examples)
    if len(keep) != len(lines):
        _write_lines(path, keep)


def start(run_dir: str, write_config: Callable[[str], None], examples: int,
          plan: dict[str, Any] | None = None) -> None:
    """Make the run folder, write its config (and the run's settled `plan`, beside it) and
    cut its logs back to `examples` (a resumed run's checkpoint); raises RunFolderError
    naming the path if the folder cannot take it."""
    with naming_write_errors(run_dir):
        os.makedirs(run_dir, exist_ok=True)
        atomic_write(os.path.join(run_dir, CONFIG), write_config)
        if plan is not None:
            atomic_write(os.path.join(run_dir, PLAN), partial(_write_json, plan))
        truncate_logs(run_dir, examples)


def _write_json(value: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=2)
        fh.write("\n")


@contextlib.contextmanager
def naming_write_errors(run_dir: str) -> Iterator[None]:
    """An OSError on the run folder, a parent of it or a file in it, as one line naming
    the path and the reason (RunFolderError); any other OSError passes unchanged."""
    try:
        yield
    except OSError as exc:
        if not isinstance(exc.filename, str) or not _on_the_way_to(run_dir, exc.filename):
            raise
        where = "" if os.path.abspath(exc.filename) == os.path.abspath(run_dir) \
            else f" {exc.filename}:"
        raise RunFolderError(f"run folder {run_dir} cannot be written:{where} "
                             f"{exc.strerror or exc}") from None


def _on_the_way_to(run_dir: str, path: str) -> bool:
    """Whether `path` is `run_dir`, one of its parents or inside it."""
    run_dir, path = os.path.abspath(run_dir), os.path.abspath(path)
    return os.path.commonpath([run_dir, path]) in (run_dir, path)


def existing_run_problem(run_dir: str) -> str | None:
    """Why `run_dir` cannot take a new run, or None."""
    if os.path.exists(os.path.join(run_dir, CONFIG)):
        return f"run folder {run_dir} already holds a run; choose a new --out"
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        return f"--out {run_dir} exists and is not a folder"
    return None
