"""Start fresh or continue: which checkpoint a run resumes from, and loading what it holds."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.config import TrainConfig
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.plan import Job  # the job that resumes: what its periods resolve for
from hvdtrain.training import run_folder
from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress, restore
from hvdtrain.training.saved_run import checked_same_run, source_optimizer

@dataclass
class ResumePlan:
    checkpoint: str | None = None
    saved: SavedProgress | None = None
    notes: list[str] = field(default_factory=list)
    # The run's checkpoints newer than the one resumed: a branch the resumed run abandons.
    newer: list[str] = field(default_factory=list)
    # The optimizer the resumed run took (`--optimizer auto` keeps it), when it is this run.
    optimizer: str | None = None
    # Saved options the resumed run keeps over this command's defaults (`kept_notice`).
    kept: dict[str, Any] = field(default_factory=dict)


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


def plan_resume(cfg: TrainConfig, job: Job) -> ResumePlan:
    """Rank 0: start fresh, or continue from which checkpoint? Raises what stops the run."""
    store = _store(cfg)
    if cfg.resume not in ("auto", "never"):
        return _plan_from(cfg.resume, cfg, store, job)
    problem = run_folder.existing_run_problem(cfg.out)
    if problem is None:
        return ResumePlan()
    _check_unfinished(cfg)
    if cfg.resume == "never":
        raise ConfigError(problem)
    optimizer, kept = checked_same_run(cfg, job)
    path, saved, problems = store.newest_sound()
    notes = [f"skipping damaged checkpoint {p}" for p in problems]
    if path is None and problems:
        raise ConfigError(f"no sound checkpoint to resume in {store.folder}: {problems[0]}")
    return ResumePlan(path, saved, notes, optimizer=optimizer, kept=kept)


def _plan_from(path: str, cfg: TrainConfig, store: CheckpointStore, job: Job) -> ResumePlan:
    """--resume PATH. A checkpoint of the run in --out continues that run, as `auto` does,
    but from an older point: the newer checkpoints become an abandoned branch, so that
    neither pruning nor a later `auto` mistakes them for the resumed run's."""
    saved, problem = store.verify(path)
    if problem:
        raise ConfigError(f"--resume {problem}")
    if store.holds(path):
        _check_unfinished(cfg)
        optimizer, kept = None, {}
        if os.path.exists(os.path.join(cfg.out, run_folder.CONFIG)):
            optimizer, kept = checked_same_run(cfg, job)
        return ResumePlan(path, saved, newer=store.newer_than(saved.progress.steps),
                          optimizer=optimizer, kept=kept)
    problem = run_folder.existing_run_problem(cfg.out)
    if problem and os.path.isdir(cfg.out):  # another run's folder: its files are not ours
        raise ConfigError(f"{problem} to start from {path}, which is not one of its "
                          "checkpoints (or --resume auto to continue that run)")
    if problem:
        raise ConfigError(problem)
    return ResumePlan(path, saved, optimizer=source_optimizer(path, cfg))


def _store(cfg: TrainConfig) -> CheckpointStore:
    return CheckpointStore(os.path.join(cfg.out, run_folder.CHECKPOINTS))


def _check_unfinished(cfg: TrainConfig) -> None:
    if os.path.exists(os.path.join(cfg.out, run_folder.SUMMARY)):
        raise ConfigError(f"run folder {cfg.out} holds a finished run; choose a new --out")


def restore_on_chief(plan: ResumePlan, state: tf.train.Checkpoint, cfg: TrainConfig) -> None:
    """Rank 0 loads the checkpoint, and sets aside the checkpoints newer than it once it
    is loaded; the state callbacks broadcast it when training starts. A checkpoint that
    does not fit stops every rank in one line (an elastic run's rank 0 alone holds the
    plan, and no call before its loop may be collective)."""
    if cfg.elastic:
        if comm.is_chief():
            _restore(plan, state, cfg)
        return
    on_chief(lambda: _restore(plan, state, cfg), name="restore")


def _restore(plan: ResumePlan, state: tf.train.Checkpoint, cfg: TrainConfig) -> None:
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


def set_aside_newer(plan: ResumePlan, cfg: TrainConfig) -> None:
    """Move the checkpoints newer than the resumed one out of the store's sight, and say
    where: they are the user's, so they are kept, but no longer this run's."""
    if not plan.newer:
        return
    store = _store(cfg)
    folder = store.set_aside(plan.newer, f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}")
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
