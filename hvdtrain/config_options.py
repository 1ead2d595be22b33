"""Command-line options built from TrainConfig's fields, for every command that takes them.

It lives on the config side so that `hvdtrain.cli` and the commands in
`hvdtrain.benchmarks` can both use it without importing each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
import types
import typing

from hvdtrain.config import (ASYNC_ONE_STEP_COMPRESSION, DEFAULT_LOCAL_LAMB_N_SYNC,
                             DEFAULT_N_SYNC, DEFAULT_ROUND_COMPRESSION,
                             RESCALED_ROUND_COMPRESSION, TrainConfig, load_config)
from hvdtrain.schedules import DEFAULT_LOCAL_LAMB_MAX_LR, DEFAULT_MAX_LR, DEFAULT_MAX_LR_OTHERWISE

# How `--help` groups the options, in order; every TrainConfig field is in one.
OPTION_GROUPS = (
    ("model and data", ("model", "dataset", "data_dir", "train_examples", "synthetic_shape",
                        "image_size", "epochs", "steps_per_epoch", "batch_size", "seed",
                        "init_weights")),
    ("optimizer and learning rate", ("optimizer", "base_lr", "lr_scaling", "max_lr",
                                     "warmup_epochs", "local_lr_workers", "lr_decay",
                                     "momentum", "lars_eta", "nesterov", "weight_decay")),
    ("mode and rounds", ("mode", "n_sync", "sync_seconds", "warm_start_steps", "warm_start",
                         "epoch_rounds", "average_bn_stats", "average_optimizer_state",
                         "outer_optimizer", "outer_lr", "outer_momentum", "rescale_rounds",
                         "round_compression", "round_fragments", "merge_after",
                         "hierarchical_sgd")),
    ("devices and speed", ("pin_cores", "model_parallel", "deterministic", "mixed_precision",
                           "xla", "fp16_allreduce", "bucket_mb")),
    ("checkpoints, resume and elastic jobs", ("checkpoint_every", "keep_checkpoints", "resume",
                                              "elastic", "elastic_commit_every",
                                              "step_timeout")),
    ("output, evaluation and logging", ("out", "validate", "eval_every", "eval_examples",
                                        "log_every", "divergence_guard")),
)
# The defaults that follow the optimizer (`hvdtrain.plan.settle` decides them for a job),
# said from the constants they are settled from; `hvdtrain plan` gives a job's own.
JOB_DEFAULTS = {
    "n_sync": (f"{DEFAULT_N_SYNC['local']} in local mode, {DEFAULT_LOCAL_LAMB_N_SYNC} on LAMB; "
               f"{DEFAULT_N_SYNC['async']} in async mode"),
    "round_compression": (f"{DEFAULT_ROUND_COMPRESSION['local']} in local mode, "
                          f"{RESCALED_ROUND_COMPRESSION} on LAMB; "
                          f"{DEFAULT_ROUND_COMPRESSION['async']} in async mode, "
                          f"{ASYNC_ONE_STEP_COMPRESSION} at a period of 1 step"),
    "max_lr": (f"{DEFAULT_MAX_LR_OTHERWISE:g}; {DEFAULT_MAX_LR['lamb']:g} on LAMB, "
               f"{DEFAULT_LOCAL_LAMB_MAX_LR:g} in flat local mode with --no-rescale-rounds"),
    "rescale_rounds": "on with LAMB in flat local mode, else off",
}


# Choices longer than this are listed in an option's help instead of beside its name.
LONGEST_METAVAR = 60


class HelpLayout(argparse.RawDescriptionHelpFormatter):
    """Each option's help on the lines under it, 74 columns wide at 80, where argparse's
    column would give it 54: two lines hold what three would. Descriptions and epilogs
    keep their own lines."""

    def __init__(self, prog, indent_increment=2, max_help_position=4, width=None):
        super().__init__(prog, indent_increment, max_help_position, width)

    def _split_lines(self, text, width):
        # Never inside an option's name (argparse's breaks --no-rescale-rounds at a hyphen).
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def field_type(tp):
    """int from `int | None`, and so on; from `int | str`, a number or a word (--n-sync 100,
    --n-sync auto)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        kinds = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = number_or_word if set(kinds) == {int, str} else kinds[0]
    return tp


def number_or_word(text: str) -> int | str:
    """'100' -> 100, 'auto' -> 'auto': TrainConfig says what is wrong with either."""
    return int(text) if text.strip().isdigit() else text


def default_text(f: dataclasses.Field) -> str | None:
    """An option's default as its help shows it: 64, on, per mode ("8 in local mode, 4 in
    async mode", in the modes that use it), or as a job settles it (`JOB_DEFAULTS`)."""
    if f.name in JOB_DEFAULTS:
        return JOB_DEFAULTS[f.name]
    per_mode = f.metadata["default_per_mode"]
    if per_mode:
        # None where no mode that uses it has its own: the help text says it.
        return ", ".join(f"{_shown(per_mode[mode])} in {mode} mode"
                         for mode in f.metadata["modes"] if mode in per_mode) or None
    return None if f.default is None else _shown(f.default)


def _shown(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def add_config_options(parser: argparse.ArgumentParser, names=None,
                       shown: bool = True) -> list[argparse.Action]:
    """One option per TrainConfig field (or per field in `names`), help from its metadata,
    in `OPTION_GROUPS`' groups; `shown=False` takes them without listing them in --help.
    Returns the options added.

    Defaults are left out of the namespace, so only what was given overrides YAML.
    Choices are shown but checked by TrainConfig.validate_values, which says what is
    wrong in one line (argparse would print its usage first).
    """
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    added = []
    for title, members in OPTION_GROUPS:
        chosen = [name for name in members if names is None or name in names]
        if chosen:
            group = parser.add_argument_group(title) if shown else parser
            added += [_add_option(group, fields[name], field_type(hints[name]), shown)
                      for name in chosen]
    return added


def _add_option(parser, f: dataclasses.Field, kind, shown: bool) -> argparse.Action:
    flag = "--" + f.name.replace("_", "-")
    choices = f.metadata["choices"]
    metavar = "{" + ",".join(choices) + "}" if choices else f.name.upper()
    listed = len(metavar) > LONGEST_METAVAR  # said in the help, not past the 80th column
    help_text = _help_text(f, choices if listed else None) if shown else argparse.SUPPRESS
    if kind is bool:
        return parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
    return parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                               metavar=f.name.upper() if listed else metavar, help=help_text)


def _help_text(f: dataclasses.Field, choices) -> str:
    """The option's help, its choices where they are listed here, and its default."""
    text = f.metadata["help"] + (f": {', '.join(choices)}" if choices else "")
    default = default_text(f)
    if default is not None:  # None: the help text itself says what happens without it
        text += f" (default: {default})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_train_options(parser: argparse.ArgumentParser,
                      shown: bool = True) -> list[argparse.Action]:
    """`hvdtrain train`'s options (`hvdtrain plan` takes them too, `shown=False`: its help
    points to train's): --config FILE.yaml, then one per TrainConfig field. `hvdtrain
    sweep` reads each run's command with them. Returns the options added."""
    config = parser.add_argument(
        "--config", metavar="FILE.yaml", default=None,
        help="YAML file of option values; options given here override it"
        if shown else argparse.SUPPRESS)
    return [config, *add_config_options(parser, shown=shown)]


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The validated config `hvdtrain train` (and `plan`) runs: the defaults, then
    --config FILE.yaml, then the options given (`add_config_options` leaves the others
    out of `args`). A sweep loads each of its runs' configs with it too, as they will."""
    overrides = {name: getattr(args, name) for name in TrainConfig.field_names()
                 if hasattr(args, name)}
    return load_config(args.config, overrides)
