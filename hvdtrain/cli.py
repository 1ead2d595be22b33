"""`hvdtrain` command line: parses options and dispatches; the work lives elsewhere.

Run one process per worker under horovodrun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo hvdtrain train --epochs 2
or a single process without it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from hvdtrain import __version__, quiet
from hvdtrain.benchmarks import bench as model_bench, compare, experiments, learning_curves, predict
from hvdtrain.cluster import command as cluster
from hvdtrain.config import load_config
from hvdtrain.config_options import HelpLayout, add_config_options, add_train_options, config_of
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.training.start import start_worker

TRAIN_DESCRIPTION = """\
Train one model; run one process per worker under horovodrun. Values come from
the defaults, then --config FILE.yaml (keys as the option names, with - or _),
then the options given here. Each option at length, and the rules of the
defaults that depend on the job: docs/configuration.md. What a job of N
workers settles on (optimizer, rate, period, rounds):
hvdtrain plan --workers N [OPTION ...]."""


def _train_epilog() -> str:
    """The run folder's files, named as `training.run_folder` writes them."""
    from hvdtrain.training import run_folder as rf

    files = ", ".join((rf.PLAN, rf.METRICS, rf.STEPS, rf.SUMMARY, rf.TENSORBOARD + "/",
                       rf.CHECKPOINTS + "/"))
    return textwrap.fill(
        f"The run folder (--out) holds {rf.CONFIG}, the resolved configuration, and {files} "
        f"and {rf.FINAL_WEIGHTS}. Only rank 0 writes them.", 80)


VERBOSE_HELP = ("keep TensorFlow's and absl's start-up notices (hidden by default; "
                "HVDTRAIN_VERBOSE=1 does the same)")

# The TrainConfig fields `hvdtrain data bench` takes.
BENCH_OPTIONS = ("dataset", "data_dir", "batch_size", "image_size", "synthetic_shape", "seed")


class OneLineErrors(argparse.ArgumentParser):
    """An argument parser whose errors take one line, like every other bad value's.

    argparse prints the whole usage (dozens of lines for `train`) before a value of the
    wrong type; the one line names the option and the value, and points to --help.
    Subcommands' parsers are made of the same class, so they answer the same way; an
    option a parser takes but lists in another's help (`hvdtrain plan` takes train's)
    points to that help, so its line is the one that command gives.
    """

    helped_by: dict[str, str] = {}  # option -> the command whose --help lists it

    def error(self, message: str):
        option = message.removeprefix("argument ").split(":")[0].split("/")[0]
        where = self.helped_by.get(option, self.prog) if message.startswith("argument ") \
            else self.prog
        self.exit(ConfigError.exit_code, f"hvdtrain: error: {message} (see {where} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="hvdtrain",
        description="Train Keras image classifiers across many workers with Horovod: "
                    "synchronous data parallelism or local SGD.")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    parser.add_argument("--verbose", action="store_true", default=False, help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train", help="train a model (one process per worker)",
        usage="hvdtrain train [--config FILE.yaml] [OPTION ...]",
        description=TRAIN_DESCRIPTION, epilog=_train_epilog(), formatter_class=HelpLayout)
    add_train_options(train)
    train.set_defaults(handler=_train)

    _add_plan_parser(commands)

    data = commands.add_parser("data", help="dataset tools").add_subparsers(
        dest="data_command", metavar="TOOL", required=True)
    convert = data.add_parser(
        "to-tfrecords", help="convert an image folder (train/, val/) to sharded TFRecords",
        description="Write SRC/train/<class>/* and SRC/val/<class>/* as ImageNet-style TFRecords "
                    "(train-*, validation-*; image/encoded JPEG, image/class/label from 1) in DST.")
    convert.add_argument("src", help="image folder with train/ and val/ (or validation/, test/)")
    convert.add_argument("dst", help="output folder")
    convert.add_argument("--train-shards", type=int, default=8, help="train files (default: 8)")
    convert.add_argument("--val-shards", type=int, default=2, help="validation files (default: 2)")
    convert.set_defaults(handler=_to_tfrecords)

    manifest = data.add_parser(
        "manifest", help="count the records of a TFRecord folder once and write its manifest.json",
        description="For train-*/validation-* TFRecords made by another tool: count every record "
                    "once and write DIR/manifest.json, so training knows the size of the set "
                    "without reading it all before step 1. `to-tfrecords` writes one itself.")
    manifest.add_argument("dir", help="folder of train-* and validation-* TFRecord files")
    manifest.set_defaults(handler=_manifest)

    bench = data.add_parser(
        "bench", help="images/sec of the input pipeline alone (no model)",
        description="Read one worker's training pipeline as fast as possible and report "
                    "images/sec (mean and 95%% interval over windows of 10 batches). Compare it "
                    "with the training images/sec: if they are close, input is the bottleneck.")
    add_config_options(bench, BENCH_OPTIONS)
    bench.add_argument("--batches", type=int, default=100, help="batches to time (default: 100)")
    bench.add_argument("--workers", type=int, default=1,
                       help="read the shard of rank 0 among this many workers (default: 1)")
    bench.set_defaults(handler=_data_bench)

    model_bench.add_parser(commands)
    experiments.add_parser(commands)
    learning_curves.add_parser(commands)
    compare.add_parser(commands)
    predict.add_parser(commands)
    cluster.add_parser(commands)
    _accept_verbose_after_the_command(commands)
    return parser


PLAN_DESCRIPTION = """\
Show what `hvdtrain train` with these options will do on a job of --workers
workers (or --hosts x --slots), without starting it: the optimizer --optimizer
auto takes and why, the peak learning rate and its cap, the period between
rounds at this size, how a round travels, the bytes a worker sends per step,
and warnings. Nothing is started and TensorFlow is not loaded.

It takes every option of `hvdtrain train` (see hvdtrain train --help) and
refuses a bad one in the same one line. With --out naming a run folder that
holds a run, the plan is that run's resumed: the options it keeps are named,
and what train would refuse before it starts (a finished run, a --resume PATH
missing or damaged, an option changed) is refused here too. Under horovodrun,
hvdtrain train prints the same lines from rank 0 and writes them to plan.json
in the run folder."""


def _add_plan_parser(commands) -> None:
    plan = commands.add_parser(
        "plan", help="show what a training job will do, without starting it",
        usage="hvdtrain plan (--workers N | --hosts H --slots S) [--host-sizes N,N,...] "
              "[--link-rate RATE] [--json] [TRAIN OPTION ...]",
        description=PLAN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--workers", type=int, default=None,
                      help="workers of the job (default: --hosts x --slots)")
    plan.add_argument("--hosts", type=int, default=None,
                      help="hosts the workers are on (default: 1); N/hosts periods count them")
    plan.add_argument("--slots", type=int, default=None,
                      help="workers per host; with --hosts, the job's workers")
    plan.add_argument("--host-sizes", metavar="N,N,...", default=None,
                      help="each host's workers, in rank order, where hosts differ in size "
                           "(e.g. 6,2): the job's --workers and --hosts; each host's rate "
                           "is given")
    plan.add_argument("--link-rate", metavar="RATE", default=None,
                      help="the link between hosts, in tc's units (10mbit, 1gbit), with "
                           "--hosts 2 or more: the plan notes whether the network binds")
    plan.add_argument("--json", action="store_true", default=False,
                      help="print the plan as one JSON object")
    # Taken, checked and refused as train's are, and listed once, by train's --help.
    train_options = add_train_options(plan.add_argument_group(
        "train options", "every option of hvdtrain train: see hvdtrain train --help"),
        shown=False)
    plan.helped_by = {flag: "hvdtrain train" for action in train_options
                      for flag in action.option_strings}
    plan.set_defaults(handler=_plan)


def _plan_job(args: argparse.Namespace):
    """The job's shape from --workers, --hosts and --slots (or --host-sizes), checked."""
    from hvdtrain.plan import Job

    if args.host_sizes is not None:
        return _job_of_host_sizes(args)
    for flag, value in (("--workers", args.workers), ("--hosts", args.hosts),
                        ("--slots", args.slots)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be a positive number, got {value}")
    hosts = args.hosts or 1
    from_slots = hosts * args.slots if args.slots is not None else None
    if args.workers is None and from_slots is None:
        raise ConfigError("hvdtrain plan needs --workers N, or --hosts H and --slots S")
    if args.workers is not None and from_slots is not None and args.workers != from_slots:
        raise ConfigError(f"--workers {args.workers} but --hosts {hosts} x --slots "
                          f"{args.slots} is {from_slots}")
    workers = args.workers or from_slots
    if hosts > workers:
        raise ConfigError(f"--hosts {hosts} is more than the {workers} workers")
    return Job(workers, hosts)


def _job_of_host_sizes(args: argparse.Namespace):
    """The job of hosts of the sizes --host-sizes gives; --workers and --hosts, if given
    too, must agree with them."""
    from hvdtrain.config import parse_int_list
    from hvdtrain.plan import Job

    sizes = tuple(parse_int_list(args.host_sizes, "--host-sizes"))
    if args.slots is not None:
        raise ConfigError("--host-sizes gives each host's workers: leave out --slots")
    for flag, value in (("--workers", sum(sizes)), ("--hosts", len(sizes))):
        given = getattr(args, flag[2:])
        if given is not None and given != value:
            raise ConfigError(f"{flag} {given} but --host-sizes {args.host_sizes} makes {value}")
    return Job(sum(sizes), len(sizes), sizes if len(set(sizes)) > 1 else ())


def _plan(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from hvdtrain.plan import settle
    from hvdtrain.training.saved_run import read_saved_run

    cfg = config_of(args).resolved()  # as the runner takes it; a bad option first, as train
    job = _plan_job(args)
    # What rank 0 of `hvdtrain train` reads and settles, refused in the same one line.
    plan = settle(cfg, job, read_saved_run(cfg))
    if args.link_rate is not None:
        from hvdtrain.benchmarks.slow_network import network_note

        note = network_note(plan.config, job.workers, job.hosts, args.link_rate)
        plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print("\n".join(f"hvdtrain plan: {line}" for line in plan.lines()))
        for warning in plan.warnings:
            print(f"hvdtrain plan: warning: {warning}")
    return 0


def _accept_verbose_after_the_command(commands) -> None:
    """`hvdtrain train --verbose` as well as `hvdtrain --verbose train`, at every level.

    SUPPRESS as the default keeps a subcommand that was not given --verbose from
    overwriting the top-level flag's value.
    """
    for sub in commands.choices.values():
        sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                         help=VERBOSE_HELP)
        for action in sub._actions:  # `hvdtrain data bench --verbose` too
            if isinstance(action, argparse._SubParsersAction):
                _accept_verbose_after_the_command(action)


def _train(args: argparse.Namespace) -> int:
    # Validate before importing TensorFlow: a typo should cost a second, not a minute.
    cfg = config_of(args)
    # Also before the runner's import: a host too small for its workers says so before
    # TensorFlow's import fills it (start_worker imports TensorFlow only after its check).
    start_worker(cfg)
    from hvdtrain.training.runner import train

    train(cfg)
    return 0


def _to_tfrecords(args: argparse.Namespace) -> int:
    if args.train_shards <= 0 or args.val_shards <= 0:
        raise ConfigError(f"--train-shards and --val-shards must be positive, got "
                          f"{args.train_shards} and {args.val_shards}")
    from hvdtrain.data.to_tfrecords import convert

    counts = convert(args.src, args.dst, args.train_shards, args.val_shards)
    print(f"hvdtrain: wrote {counts['train']} training and {counts['validation']} validation "
          f"images of {counts['classes']} classes to {args.dst}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    from hvdtrain.data.to_tfrecords import write_manifest_of

    counts = write_manifest_of(args.dir)
    print(f"hvdtrain: counted {counts['train']} training and {counts['validation']} validation "
          f"records; wrote {counts['path']}")
    return 0


def _data_bench(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in BENCH_OPTIONS if hasattr(args, name)}
    cfg = load_config(None, overrides)
    if args.batches <= 0 or args.workers <= 0:
        raise ConfigError(f"--batches and --workers must be positive, got {args.batches} and {args.workers}")
    import json

    from hvdtrain.data.bench import dataset_throughput

    result = dataset_throughput(cfg, args.batches, args.workers)
    print(f"hvdtrain: {cfg.dataset} input pipeline: {result['images_per_sec']:.0f} ± "
          f"{result['ci95']:.0f} images/sec (batch {cfg.batch_size}, one worker of {args.workers})")
    print(json.dumps(result, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Before anything imports TensorFlow: its start-up notices are written as it loads.
    quiet.quiet_startup(verbose=args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except HvdtrainError as exc:  # the Keras layer's argument checks too (ArgumentError)
        print(f"hvdtrain: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
