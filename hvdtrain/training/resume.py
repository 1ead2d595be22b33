"""Start fresh or continue: which checkpoint a run resumes from, and loading what it holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.config import UNUSED_IN_SYNC, TrainConfig, load_config, option_flag
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.training import run_folder
from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress, restore

# Options that may differ between a run and its resumption (the number of workers is not
# an option: progress is kept in examples, so any -np can continue a run).
# How workers sit on cores and how gradients are grouped change speed, not what is learned;
# --deterministic only how sums round.
RESUMABLE_CHANGES = {"out", "resume", "step_timeout", "log_every", "validate", "keep_checkpoints",
                     "data_dir", "checkpoint_every", "init_weights", "pin_cores", "bucket_mb",
                     "deterministic"}


@dataclass
class ResumePlan:
    checkpoint: str | None = None
    saved: SavedProgress | None = None
    notes: list[str] = field(default_factory=list)


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


def plan_resume(cfg: TrainConfig) -> ResumePlan:
    """Rank 0: start fresh, or continue from which checkpoint? Raises what stops the run."""
    store = CheckpointStore(os.path.join(cfg.out, run_folder.CHECKPOINTS))
    if cfg.resume not in ("auto", "never"):
        saved, problem = store.verify(cfg.resume)
        if problem:
            raise ConfigError(f"--resume {problem}")
        return ResumePlan(cfg.resume, saved)
    problem = run_folder.existing_run_problem(cfg.out)
    if problem is None:
        return ResumePlan()
    if os.path.exists(os.path.join(cfg.out, run_folder.SUMMARY)):
        raise ConfigError(f"run folder {cfg.out} holds a finished run; choose a new --out")
    if cfg.resume == "never":
        raise ConfigError(problem)
    _check_same_run(cfg, load_config(os.path.join(cfg.out, run_folder.CONFIG)).resolved())
    path, saved, problems = store.newest_sound()
    notes = [f"skipping damaged checkpoint {p}" for p in problems]
    if path is None and problems:
        raise ConfigError(f"no sound checkpoint to resume in {store.folder}: {problems[0]}")
    return ResumePlan(path, saved, notes)


def _check_same_run(cfg: TrainConfig, saved: TrainConfig) -> None:
    ignored = set(RESUMABLE_CHANGES)
    if cfg.mode == saved.mode == "sync":  # e.g. a run saved under an older default period
        ignored.update(UNUSED_IN_SYNC)
    for name in TrainConfig.field_names():
        if name not in ignored and getattr(saved, name) != getattr(cfg, name):
            raise ConfigError(
                f"cannot resume {cfg.out}: {option_flag(name)} is {getattr(cfg, name)!r} "
                f"but the run was started with {getattr(saved, name)!r}")


def restore_on_chief(plan: ResumePlan, state: tf.train.Checkpoint, cfg: TrainConfig) -> None:
    """Rank 0 loads the checkpoint; the state callbacks broadcast it when training starts."""
    if not comm.is_chief():
        return
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


def load_initial_weights(model: keras.Model, path: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"--init-weights file not found: {path}")
    try:
        model.load_weights(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--init-weights {path} does not fit model {model.name}: "
                          f"{str(exc).splitlines()[0]}") from None
