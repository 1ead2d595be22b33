"""The run folder and its files; written by rank 0 only, every file atomically.

A file appears under its final name only once complete (written to a temporary
name in the same folder, flushed, then renamed), so a crash never leaves a
half-written config, summary or checkpoint.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import time
from typing import Any, Callable

CONFIG = "config.yaml"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
FINAL_WEIGHTS = "model.weights.h5"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"


def default_run_dir(model: str, mode: str, root: str = "runs") -> str:
    return os.path.join(root, f"{time.strftime('%Y%m%d-%H%M%S')}-{model}-{mode}")


def usual_mode(mode: int) -> int:
    """`mode` less the process umask: what open() or mkdir() would have given.

    Temporary files and folders are created private (0600, 0700); a run folder's
    files should be as readable as any other the user writes, e.g. by the group on a
    shared cluster.
    """
    umask = os.umask(0o022)
    os.umask(umask)
    return mode & ~umask


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then move the finished file to `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    # Keep the final suffix: Keras picks the weights format from the file name.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, usual_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, data: dict[str, Any]) -> None:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
    atomic_write(path, write)


def write_csv(path: str, rows: list[dict[str, Any]], columns=None) -> None:
    """A table with a header line; `columns` (default: the first row's keys) in order."""
    def write(tmp):
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns or rows[0]), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    atomic_write(path, write)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def append_jsonl(path: str, record: dict[str, Any]) -> None:
    # One short line per epoch; appended with a single write so a reader never sees half a line.
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()


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
