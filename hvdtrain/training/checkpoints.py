"""Training checkpoints: written atomically, verified on resume, the newest K kept.

A checkpoint is a folder `step-000001234/` holding a TensorFlow checkpoint (model
weights and statistics, optimizer slots and step, local-SGD outer-optimizer state)
and `meta.json` (where training stood, and a SHA-256 of every file). It is written
under a temporary name and renamed into place, so a crash leaves either the whole
checkpoint or only a `.tmp-*` folder, which is ignored and removed later. On resume
the manifest is checked; a damaged newest checkpoint is reported and the one before
it is used. Checkpoints a resume from an older one leaves behind are moved into a
folder of their own (`set_aside`), where the store no longer sees them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hvdtrain.errors import ConfigError
from hvdtrain.files import usual_mode
from hvdtrain.progress import TrainingProgress
from hvdtrain.training import run_folder

if TYPE_CHECKING:  # reading and verifying checkpoints needs no TensorFlow (`hvdtrain plan`)
    import tensorflow as tf


STATE_PREFIX = "state"
META = "meta.json"
_NAME = re.compile(r"^step-(\d{9})$")


@dataclass(frozen=True)
class SavedProgress:
    """Where training stood when a checkpoint was written, and with how many workers."""

    # Its seconds trained and evaluated are the run's so far, every process's (0 in
    # checkpoints written before they were kept): a resumed run's count goes on from them.
    progress: TrainingProgress
    workers: int
    batch_size: int

    def to_json(self) -> dict:
        return {**self.progress.saved(), "workers": self.workers, "batch_size": self.batch_size}

    @classmethod
    def from_json(cls, meta: dict) -> "SavedProgress":
        meta = dict(meta)
        workers, batch_size = meta.pop("workers"), meta.pop("batch_size")
        if "step" in meta:  # written before progress was counted in examples
            global_batch = workers * batch_size
            meta = {"epoch_examples": meta["steps_per_epoch"] * global_batch,
                    "examples": meta["step"] * global_batch, "steps": meta["step"],
                    "averaging_rounds": meta.get("sync_count", 0)}
        return cls(TrainingProgress(**meta), int(workers), int(batch_size))


def _step_of(path: str) -> int:
    return int(_NAME.match(os.path.basename(path)).group(1))


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _new_folder(path: str) -> str:
    """Make the folder `path`, or the first of `path-2`, `path-3`, ... not taken."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for number in itertools.count(1):
        candidate = path if number == 1 else f"{path}-{number}"
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            continue


class CheckpointStore:
    """The `checkpoints/` folder of a run; only rank 0 writes it."""

    def __init__(self, folder: str, keep: int = 3):
        self.folder = folder
        self.keep = keep

    def path_for(self, step: int) -> str:
        return os.path.join(self.folder, f"step-{step:09d}")

    def save(self, state: tf.train.Checkpoint, saved: SavedProgress) -> str:
        os.makedirs(self.folder, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=self.folder, prefix=".tmp-")
        try:
            state.write(os.path.join(tmp, STATE_PREFIX))
            files = {name: _sha256(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
            with open(os.path.join(tmp, META), "w", encoding="utf-8") as fh:
                json.dump({"progress": saved.to_json(), "files": files}, fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            final = self.path_for(saved.progress.steps)
            if os.path.exists(final):  # the same step saved again (e.g. after a resume)
                shutil.rmtree(final)
            os.chmod(tmp, usual_mode(0o777))
            os.rename(tmp, final)
            _fsync_dir(self.folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def checkpoints(self) -> list[str]:
        """Finished checkpoints, newest first."""
        if not os.path.isdir(self.folder):
            return []
        names = sorted((n for n in os.listdir(self.folder) if _NAME.match(n)), reverse=True)
        return [os.path.join(self.folder, n) for n in names]

    def newer_than(self, step: int) -> list[str]:
        """Finished checkpoints of a later step than `step`, newest first."""
        return [path for path in self.checkpoints() if _step_of(path) > step]

    def holds(self, path: str) -> bool:
        """Whether the checkpoint folder `path` is one of this store's."""
        return run_folder.holds_checkpoint(self.folder, path)

    def set_aside(self, paths: list[str], name: str) -> str:
        """Move checkpoints into a new subfolder `name` (`name-2`, `name-3`, ... if that
        is taken: two branches abandoned within one second stay apart), whose own name
        `checkpoints()` ignores: kept for the user, never resumed nor pruned. Returns the
        subfolder."""
        folder = _new_folder(os.path.join(self.folder, name))
        for path in paths:
            os.rename(path, os.path.join(folder, os.path.basename(path)))
        _fsync_dir(self.folder)
        return folder

    def _prune(self) -> None:
        for old in self.checkpoints()[self.keep:]:
            # Renamed first: a crash while deleting leaves a `.tmp-*` folder, never a
            # half-deleted checkpoint under its final name.
            doomed = tempfile.mkdtemp(dir=self.folder, prefix=".tmp-")
            os.rename(old, os.path.join(doomed, os.path.basename(old)))
            shutil.rmtree(doomed, ignore_errors=True)
        for name in os.listdir(self.folder):
            if name.startswith(".tmp-"):  # left by a crash during an earlier save
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)

    @staticmethod
    def verify(path: str) -> tuple[SavedProgress | None, str | None]:
        """(progress, None) for a sound checkpoint, (None, why not) otherwise."""
        try:
            with open(os.path.join(path, META), encoding="utf-8") as fh:
                meta = json.load(fh)
            progress = SavedProgress.from_json(meta["progress"])
            files = meta["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"{path}: unreadable {META} ({exc.__class__.__name__})"
        if not any(name.startswith(STATE_PREFIX + ".index") for name in files):
            return None, f"{path}: {META} lists no checkpoint index"
        for name, digest in files.items():
            file = os.path.join(path, name)
            if not os.path.isfile(file):
                return None, f"{path}: {name} is missing"
            if _sha256(file) != digest:
                return None, f"{path}: {name} is damaged (checksum mismatch)"
        return progress, None

    def newest(self) -> str | None:
        """The newest finished checkpoint, unverified (for messages)."""
        found = self.checkpoints()
        return found[0] if found else None

    def newest_sound(self) -> tuple[str | None, SavedProgress | None, list[str]]:
        """The newest checkpoint that verifies, its progress, and what was wrong with newer ones."""
        problems = []
        for path in self.checkpoints():
            progress, problem = self.verify(path)
            if problem is None:
                return path, progress, problems
            problems.append(problem)
        return None, None, problems


def restore(state: tf.train.Checkpoint, path: str) -> None:
    """Load a checkpoint into already-built variables; every saved value must find its
    variable. One that does not fit (another model, another optimizer's slots) is a
    ConfigError naming the checkpoint, not TensorFlow's traceback."""
    import tensorflow as tf

    try:
        status = state.read(os.path.join(path, STATE_PREFIX))
        status.assert_existing_objects_matched()
    except (ValueError, AssertionError, tf.errors.OpError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"checkpoint {path} does not fit this run's model and optimizer: "
                          f"{first}") from None
