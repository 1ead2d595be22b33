"""`hvdtrain` command line: parses options and dispatches; the work lives elsewhere.

Run one process per worker under horovodrun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo hvdtrain train --epochs 2
or a single process without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing

from hvdtrain import __version__
from hvdtrain.config import TrainConfig, load_config
from hvdtrain.errors import HvdtrainError

TRAIN_EPILOG = """\
Values come from the defaults, then --config FILE.yaml (keys as the option names,
with - or _), then the options given here. The resolved configuration is saved as
config.yaml in the run folder, which also gets metrics.jsonl, summary.json,
tensorboard/, checkpoints/ and model.weights.h5. Only rank 0 writes them.
"""


def _field_type(tp) -> type:
    """int from `int | None`, and so on."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        kind = _field_type(hints[f.name])
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS,
                                help=f"{help_text} (default: {'on' if f.default else 'off'})")
            continue
        choices = f.metadata["choices"]
        if f.default is not None:  # a None default is explained in the help text itself
            help_text += f" (default: {f.default})"
        parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                            choices=choices, metavar=None if choices else f.name.upper(),
                            help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdtrain",
        description="Train Keras image classifiers across many workers with Horovod: "
                    "synchronous data parallelism or local SGD.")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train", help="train a model (one process per worker)",
        description="Train one model; run one process per worker under horovodrun.",
        epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", metavar="FILE.yaml", default=None,
                       help="YAML file of option values; options given here override it")
    _add_config_options(train)
    train.set_defaults(handler=_train)
    return parser


def _train(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in TrainConfig.field_names()
                 if hasattr(args, name)}
    # Validate before importing TensorFlow: a typo should cost a second, not a minute.
    cfg = load_config(args.config, overrides)
    from hvdtrain.training.runner import train

    train(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except HvdtrainError as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
