"""Continue a run: loading what the checkpoint a run resumes holds, on rank 0 (which one,
`hvdtrain.training.saved_run.read_saved_run` says), and the one-line refusals of what
only rank 0 learns."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.config import TrainConfig
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.training import run_folder
from hvdtrain.training.checkpoints import CheckpointStore, restore
from hvdtrain.training.saved_run import SavedRun


def on_chief(compute: Callable[[], Any], name: str) -> Any:
    """`compute()` on rank 0, its result on every rank; its HvdtrainError raised on every
    rank as a ConfigError, so all workers exit together instead of waiting for rank 0."""
    value, problem = None, None
    if comm.is_chief():
        try:
            value = compute()
        except HvdtrainError as exc:
            problem = str(exc)
    value, problem = comm.broadcast_object((value, problem), name=name)
    if problem:
        raise ConfigError(problem)
    return value


def restore_on_chief(plan: SavedRun, state: tf.train.Checkpoint, cfg: TrainConfig) -> None:
    """Rank 0 loads the checkpoint, and sets aside the checkpoints newer than it once it
    is loaded; the state callbacks broadcast it when training starts. A checkpoint that
    does not fit stops every rank in one line (an elastic run's rank 0 alone reads the
    checkpoint, and no call before its loop may be collective)."""
    if cfg.elastic:
        if comm.is_chief():
            _restore(plan, state, cfg)
        return
    on_chief(lambda: _restore(plan, state, cfg), name="restore")


def _restore(plan: SavedRun, state: tf.train.Checkpoint, cfg: TrainConfig) -> None:
    for note in plan.notes:
        print(f"hvdtrain: {note}", flush=True)
    restore(state, plan.checkpoint)
    progress = plan.saved.progress
    print(f"hvdtrain: resuming from {plan.checkpoint} (step {progress.steps}, "
          f"{progress.examples} examples, epoch {progress.epoch + 1} of {cfg.epochs})", flush=True)
    if (plan.saved.workers, plan.saved.batch_size) != (comm.size(), cfg.batch_size):
        print(f"hvdtrain: the checkpoint was written by {plan.saved.workers} workers with batch "
              f"{plan.saved.batch_size}; continuing with {comm.size()} and {cfg.batch_size}: the "
              "schedule continues from the examples seen, the data order restarts", flush=True)
    set_aside_newer(plan, cfg)


def set_aside_newer(plan: SavedRun, cfg: TrainConfig) -> None:
    """Move the checkpoints newer than the resumed one out of the store's sight, and say
    where: they are the user's, so they are kept, but no longer this run's."""
    if not plan.newer:
        return
    store = CheckpointStore(os.path.join(cfg.out, run_folder.CHECKPOINTS))
    folder = store.set_aside(list(plan.newer), f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}")
    # The run's logs are cut back to the resumed checkpoint: the cut lines are the branch's.
    logs = run_folder.copy_cut_lines(cfg.out, plan.saved.progress.examples, folder)
    names = ", ".join(os.path.basename(path) for path in reversed(plan.newer))
    with_logs = f", with the lines of {' and '.join(logs)} written after the resumed one" \
        if logs else ""
    print(f"hvdtrain: resuming from an older checkpoint starts a new branch: moved the newer "
          f"{names} to {folder} (no longer resumed{with_logs}; delete them when done)",
          flush=True)


def load_initial_weights(model: keras.Model, path: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"--init-weights file not found: {path}")
    try:
        model.load_weights(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--init-weights {path} does not fit model {model.name}: "
                          f"{str(exc).splitlines()[0]}") from None
