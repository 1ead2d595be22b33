"""What a run starts from, read before any choice is made, and the saved run against the
command that resumes it.

`read_saved_run` reads what --out and --resume hold: the checkpoint a run resumes, where
it stood, and the config of the run that wrote it; it refuses, in one line, what stops a
run before anything is chosen (a finished run folder, a folder that holds another run,
a checkpoint that is missing or damaged). `kept_options` compares a saved config with
the command's: which options the run keeps as saved, which it refuses to change.
`hvdtrain.plan.settle` takes both, for `hvdtrain train` and `hvdtrain plan` alike.
Pure: no TensorFlow, so `hvdtrain plan` reads them before any worker starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from hvdtrain.config import (RESUMABLE_CHANGES, TrainConfig, declared_default, ignored_in,
                             load_saved_config, option_flag)
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import AUTO
from hvdtrain.rounds.periods import resolve_period
from hvdtrain.training import run_folder
from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress


@dataclass(frozen=True)
class SavedRun:
    """Where a run starts, as --out and --resume say (a new run: all None)."""

    checkpoint: str | None = None        # the checkpoint resumed; None: from the start
    saved: SavedProgress | None = None   # where that checkpoint stood
    config: TrainConfig | None = None    # the saved config of the run in --out that goes on
    # --resume PATH of another run's checkpoint: that run's config.yaml and the optimizer
    # it took (None when it saved none, or saved `auto` before auto chose).
    source: str | None = None
    source_optimizer: str | None = None
    notes: tuple[str, ...] = ()          # damaged checkpoints skipped
    # The run's checkpoints newer than the one resumed: a branch the resumed run abandons.
    newer: tuple[str, ...] = ()


def read_saved_run(cfg: TrainConfig) -> SavedRun:
    """Start fresh, or continue from which checkpoint: the run folder --out and the
    checkpoint --resume names, read and checked. Raises ConfigError for what stops the run
    whatever the options: a finished run, a folder of another run, a checkpoint missing or
    damaged."""
    if cfg.resume not in ("auto", "never"):
        return _from_checkpoint(cfg.resume, cfg)
    problem = run_folder.existing_run_problem(cfg.out) if cfg.out else None
    if problem is None:
        return SavedRun()
    _check_unfinished(cfg)
    if cfg.resume == "never":
        raise ConfigError(problem)
    store = _store(cfg)
    path, saved, problems = store.newest_sound()
    if path is None and problems:
        raise ConfigError(f"no sound checkpoint to resume in {store.folder}: {problems[0]}")
    return SavedRun(path, saved, _saved_config(cfg),
                    notes=tuple(f"skipping damaged checkpoint {p}" for p in problems))


def read_saved_config(cfg: TrainConfig) -> SavedRun:
    """The part of `read_saved_run` that settles choices (the config of the run that goes
    on, or the optimizer of the run whose checkpoint --resume names), which any worker can
    read alone at any time. An elastic job's workers each read it before their loop: one
    that joins later finds the run's own config.yaml, which holds the plan the others
    settled, so it settles the same."""
    if cfg.resume not in ("auto", "never") and not _in_run(cfg.resume, cfg):
        return _source_run(cfg.resume)
    if cfg.resume == "never" or not cfg.out \
            or not os.path.isfile(os.path.join(cfg.out, run_folder.CONFIG)):
        return SavedRun()
    return SavedRun(config=_saved_config(cfg))


def _from_checkpoint(path: str, cfg: TrainConfig) -> SavedRun:
    """--resume PATH. A checkpoint of the run in --out continues that run, as `auto` does,
    but from an older point: the newer checkpoints become an abandoned branch, so that
    neither pruning nor a later `auto` mistakes them for the resumed run's."""
    saved, problem = CheckpointStore.verify(path)
    if problem:
        raise ConfigError(f"--resume {problem}")
    if _in_run(path, cfg):
        _check_unfinished(cfg)
        config = _saved_config(cfg) if os.path.exists(
            os.path.join(cfg.out, run_folder.CONFIG)) else None
        return SavedRun(path, saved, config,
                        newer=tuple(_store(cfg).newer_than(saved.progress.steps)))
    problem = run_folder.existing_run_problem(cfg.out) if cfg.out else None
    if problem and os.path.isdir(cfg.out):  # another run's folder: its files are not ours
        raise ConfigError(f"{problem} to start from {path}, which is not one of its "
                          "checkpoints (or --resume auto to continue that run)")
    if problem:
        raise ConfigError(problem)
    return dataclasses.replace(_source_run(path), checkpoint=path, saved=saved)


def _in_run(path: str, cfg: TrainConfig) -> bool:
    """Whether checkpoint `path` is one of the run in --out's own."""
    return bool(cfg.out) and _store(cfg).holds(path)


def _source_run(path: str) -> SavedRun:
    """The optimizer of the run that wrote checkpoint `path` (from its run folder's
    config.yaml, if it has one), which `--optimizer auto` takes: a choice made again for
    this job's size could be another optimizer, whose slots the checkpoint lacks."""
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))),
                          run_folder.CONFIG)
    if not os.path.isfile(config):
        return SavedRun()
    taken = load_saved_config(config).optimizer
    # Saved before auto chose: nothing known.
    return SavedRun(source=config, source_optimizer=None if taken == AUTO else taken)


def _store(cfg: TrainConfig) -> CheckpointStore:
    return CheckpointStore(os.path.join(cfg.out, run_folder.CHECKPOINTS))


def _check_unfinished(cfg: TrainConfig) -> None:
    if os.path.exists(os.path.join(cfg.out, run_folder.SUMMARY)):
        raise ConfigError(f"run folder {cfg.out} holds a finished run; choose a new --out")


def _saved_config(cfg: TrainConfig) -> TrainConfig:
    return load_saved_config(os.path.join(cfg.out, run_folder.CONFIG)).resolved()


# Options that shape the job before the run folder is read (Horovod's process sets, the
# devices, elastic launching): a resumed run must be given them as the run was.
FIXED_AT_START = frozenset({"elastic", "hierarchical_sgd", "model_parallel"})


def kept_options(cfg: TrainConfig, now: TrainConfig, saved: TrainConfig, workers: int,
                 hosts: int) -> dict[str, Any]:
    """The options the run keeps as saved: those that differ where this command (`cfg`,
    and `now`, the same with the optimizer the run took) gives the default (an upgrade may
    have changed it since, and running the same command again is how a stopped run goes
    on). An option given other than saved is refused; so is any difference in an elastic
    run (`hvdtrain.plan.settle` settles it on every worker, but a default that differs
    would be kept by whichever read it), and in the options fixed at start."""
    ignored = set(RESUMABLE_CHANGES)
    if cfg.mode == saved.mode or _is_default(cfg, "mode"):
        ignored.update(ignored_in(saved.mode))  # e.g. a sync run saved under an older period
    kept = {}
    for name in TrainConfig.field_names():
        if name in ignored or _same(name, getattr(saved, name), getattr(now, name), workers,
                                    hosts):
            continue
        given = not _is_default(cfg, name)
        if given or cfg.elastic or name in FIXED_AT_START:
            hint = "" if given else f" (give {_as_given(name, getattr(saved, name))} to go on)"
            raise ConfigError(
                f"cannot resume {cfg.out}: {option_flag(name)} is {getattr(now, name)!r} but "
                f"the run was started with {getattr(saved, name)!r}{hint}")
        kept[name] = getattr(saved, name)
    dataclasses.replace(cfg, **kept).validate_values()
    return kept


def _same(name: str, saved: Any, now: Any, workers: int, hosts: int) -> bool:
    """Equal values; for the period, equal steps for this job (`40/workers` and 5 at 8)."""
    if name == "n_sync" and saved is not None and now is not None:
        return resolve_period(saved, workers, hosts) == resolve_period(now, workers, hosts)
    return saved == now


def _is_default(cfg: TrainConfig, name: str) -> bool:
    """Whether `cfg` holds option `name` at its default for this configuration (given or
    not: a command cannot tell the two apart)."""
    default = dataclasses.replace(cfg, **{name: declared_default(name)}).resolved()
    return getattr(default, name) == getattr(cfg, name)


def _as_given(name: str, value: Any) -> str:
    """The option as a command gives it: `--n-sync 2`, `--hierarchical-sgd`, `--no-xla`."""
    if isinstance(value, bool):
        return option_flag(name) if value else "--no-" + option_flag(name)[2:]
    return f"{option_flag(name)} {value}"


def kept_notice(settled: TrainConfig, kept: dict[str, Any]) -> str:
    """Rank 0's line when a resumed run keeps saved options over this command's defaults
    (`settled`: the plan's config, the options kept in it). It leaves out what follows
    from the others kept and from the optimizer the run took: a kept `--mode local` brings
    that mode's own defaults, which the user need not be told apart."""
    named = {name: value for name, value in kept.items()
             if not _is_default(settled, name)} or kept
    options = ", ".join(_as_given(name, value) for name, value in named.items())
    return (f"hvdtrain: resuming {settled.out} as it was started: {options} (this command "
            f"gave the defaults, which differ)")
