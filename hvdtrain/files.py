"""Writing files so that a crash never leaves half of one.

A file appears under its final name only once complete: it is written to a
temporary name in the same folder, flushed to disk, then renamed. Used by the run
folder, the checkpoints, the dataset converters and the benchmarks alike.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from typing import Any, Callable


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
