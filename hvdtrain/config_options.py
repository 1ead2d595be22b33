"""Command-line options built from TrainConfig's fields, for every command that takes them.

It lives on the config side so that `hvdtrain.cli` and the commands in
`hvdtrain.benchmarks` can both use it without importing each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from hvdtrain.config import TrainConfig, load_config


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
    """An option's default as its help shows it: 64, on, or per mode ("40/workers in local
    mode, 10/workers in async mode", in the modes that use it)."""
    per_mode = f.metadata["default_per_mode"]
    if per_mode:
        # None where no mode that uses it has its own: the help text says it.
        return ", ".join(f"{_shown(per_mode[mode])} in {mode} mode"
                         for mode in f.metadata["modes"] if mode in per_mode) or None
    return None if f.default is None else _shown(f.default)


def _shown(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def add_config_options(parser: argparse.ArgumentParser, names=None) -> None:
    """One option per TrainConfig field (or per field in `names`), help from its metadata.

    Defaults are left out of the namespace, so only what was given overrides YAML.
    Choices are shown but checked by TrainConfig.validate_values, which says what is
    wrong in one line (argparse would print its usage first).
    """
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if names is not None and f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        kind = field_type(hints[f.name])
        default = default_text(f)
        if default is not None:  # None: the help text itself says what happens without it
            help_text += f" (default: {default})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
            continue
        choices = f.metadata["choices"]
        parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                            metavar="{" + ",".join(choices) + "}" if choices else f.name.upper(),
                            help=help_text)


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """`hvdtrain train`'s options (`hvdtrain plan` takes them too): --config FILE.yaml,
    then one per TrainConfig field. `hvdtrain sweep` reads each run's command with them."""
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help="YAML file of option values; options given here override it")
    add_config_options(parser)


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The validated config `hvdtrain train` (and `plan`) runs: the defaults, then
    --config FILE.yaml, then the options given (`add_config_options` leaves the others
    out of `args`). A sweep loads each of its runs' configs with it too, as they will."""
    overrides = {name: getattr(args, name) for name in TrainConfig.field_names()
                 if hasattr(args, name)}
    return load_config(args.config, overrides)
