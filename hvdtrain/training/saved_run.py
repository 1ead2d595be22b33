"""A run folder's saved run against the command that resumes it: which options the run
keeps as saved (a default changed since, an option left out), which it refuses to
change, and the line that says so. Pure: no TensorFlow, so `hvdtrain plan --out` reads
it before any worker starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hvdtrain.config import (RESUMABLE_CHANGES, TrainConfig, declared_default, ignored_in,
                             load_saved_config, option_flag)
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import settled
from hvdtrain.plan import Job
from hvdtrain.rounds.periods import resolve_period
from hvdtrain.training import run_folder


def _saved_config(cfg: TrainConfig) -> TrainConfig:
    return load_saved_config(os.path.join(cfg.out, run_folder.CONFIG)).resolved()


# Options that shape the job before the run folder is read (Horovod's process sets, the
# devices, elastic launching): a resumed run must be given them as the run was.
FIXED_AT_START = frozenset({"elastic", "hierarchical_sgd", "model_parallel"})


def checked_same_run(cfg: TrainConfig, job: Job) -> tuple[str, dict[str, Any]]:
    """Refuse to resume the run in --out under another configuration; return the
    optimizer it took (which `--optimizer auto` keeps) and the saved values it keeps where
    this command left an option at its default."""
    # A config.yaml saved before `auto` chose takes auto's choice for this job.
    saved = settled(_saved_config(cfg), job.workers)
    kept = _check_same_run(cfg, saved, job)
    dataclasses.replace(cfg, **kept).validate_values()
    return saved.optimizer, kept


def _check_same_run(cfg: TrainConfig, saved: TrainConfig, job: Job) -> dict[str, Any]:
    """The options the run keeps as saved: those that differ where this command gives the
    default (an upgrade may have changed it since, and running the same command again is
    how a stopped run goes on). An option given other than saved is refused; so is any
    difference in an elastic run, whose workers do not all see the resume plan, and in
    the options fixed at start."""
    now = settled(cfg, job.workers, saved.optimizer)  # auto as the run took it
    ignored = set(RESUMABLE_CHANGES)
    if cfg.mode == saved.mode or _is_default(cfg, "mode"):
        ignored.update(ignored_in(saved.mode))  # e.g. a sync run saved under an older period
    kept = {}
    for name in TrainConfig.field_names():
        if name in ignored or _same(name, getattr(saved, name), getattr(now, name), job):
            continue
        given = not _is_default(cfg, name)
        if given or cfg.elastic or name in FIXED_AT_START:
            hint = "" if given else f" (give {_as_given(name, getattr(saved, name))} to go on)"
            raise ConfigError(
                f"cannot resume {cfg.out}: {option_flag(name)} is {getattr(now, name)!r} but "
                f"the run was started with {getattr(saved, name)!r}{hint}")
        kept[name] = getattr(saved, name)
    return kept


def _same(name: str, saved: Any, now: Any, job: Job) -> bool:
    """Equal values; for the period, equal steps for this job (`40/workers` and 5 at 8)."""
    if name == "n_sync" and saved is not None and now is not None:
        return resolve_period(saved, job.workers, job.hosts) == \
            resolve_period(now, job.workers, job.hosts)
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


def kept_notice(cfg: TrainConfig, kept: dict[str, Any], optimizer: str) -> str:
    """Rank 0's line when a resumed run keeps saved options over this command's defaults.
    It leaves out what follows from the others kept and the `optimizer` the run took: a
    kept `--mode local` brings that mode's own defaults, which the user need not be told
    apart."""
    under = settled(dataclasses.replace(cfg, **kept), 0, resumed=optimizer)  # 0: no choice made
    named = {name: value for name, value in kept.items()
             if not _is_default(under, name)} or kept
    options = ", ".join(_as_given(name, value) for name, value in named.items())
    return (f"hvdtrain: resuming {cfg.out} as it was started: {options} (this command gave "
            f"the defaults, which differ)")


def source_optimizer(path: str, cfg: TrainConfig) -> str | None:
    """The optimizer of the run that wrote checkpoint `path` (from its run folder's
    config.yaml, if it has one), which `--optimizer auto` takes: a choice made again for
    this job's size could be another optimizer, whose slots the checkpoint lacks."""
    source_run = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    config = os.path.join(source_run, run_folder.CONFIG)
    if not os.path.isfile(config):
        return None
    taken = load_saved_config(config).optimizer
    if taken == "auto":  # saved before auto chose: nothing known
        return None
    if cfg.optimizer not in ("auto", taken):
        raise ConfigError(f"--resume {path}: the checkpoint was written with --optimizer "
                          f"{taken} ({config}), not {cfg.optimizer}: give --optimizer "
                          f"{taken} or auto")
    return taken
