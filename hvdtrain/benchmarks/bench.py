"""`hvdtrain bench`: options, one job per worker count, and the scaling table."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hvdtrain.benchmarks.launching import run_job
from hvdtrain.benchmarks.placement import add_hosts_option, check_where, job_command, topology
from hvdtrain.benchmarks.scaling import (add_scaling, overhead_against_reference,
                                         ratios_to_reference)
from hvdtrain.buckets import parse_bucket_spec
from hvdtrain.config import (DEFAULT_BUCKET_MB, DEFAULT_ROUND_COMPRESSION, LOCAL_MODES,
                             OPTIMIZERS, RESCALED_ROUND_COMPRESSION, ROUND_COMPRESSIONS,
                             load_config, parse_choice_list, parse_int_list, parse_seconds_list,
                             parse_shape, rounds_compression)
from hvdtrain.config_options import add_config_options
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.optimizer_choice import AUTO, BENCH_OPTIMIZER
from hvdtrain.rounds.periods import TRAINS_DEFAULT, is_rule

MODES = ("sync", *LOCAL_MODES, "independent", "horovod")
# Hierarchical local SGD (--hierarchical-sgd): a host's workers average gradients every
# step, the hosts' models meet every n_sync steps. Measured on hosts of several workers.
HIERARCHICAL_OF = {"hlocal": "local", "hasync": "async"}

CONFIG_OPTIONS = ("model", "batch_size", "seed", "xla", "mixed_precision", "fp16_allreduce")
DEFAULT_SHAPES = {"lenet": "28x28x1", "resnet20": "32x32x3", "resnet32": "32x32x3",
                  "resnet56": "32x32x3"}

DESCRIPTION = """\
Training throughput of one model on random images: by default one batch per worker,
made once and kept on its device (as tf_cnn_benchmarks does; --host-data feeds them
through an in-memory tf.data pipeline instead), so only the model, the optimizer and
the communication are measured. Every setup trains through the same code as `hvdtrain
train`, with --optimizer (sgd by default) at every worker count and training's defaults
for the rest; the first --warmup-steps steps are not timed. Reports images/sec per worker
and in total (mean and 95% interval: over windows of --window steps, or over --repeats
measurements taken in turn), the share of a step spent in allreduce (the exchange
timed on its own once training stops, times the exchanges per step; in async mode that
is what a blocking exchange would cost, not what the workers waited), the share of the
timed steps the workers' training threads spent in averaging rounds (what they did
wait), and bytes allreduced per step. Modes: sync (gradients averaged every step);
local (weights averaged every --n-sync steps, one setup per value, or every
--sync-seconds); async (as local, with each round's allreduce running behind the next
steps); independent (no communication at all: the upper limit); horovod (a bare
Horovod + model.fit script: a train_step that allreduces each gradient, the reference
for hvdtrain's own overhead).

Without horovodrun around it, it starts one job per --workers value (horovodrun
-H localhost:K, or the first K slots of --hostfile) and writes bench.json and
bench.csv with speed-up and efficiency against the fewest workers. Under
horovodrun it measures that job alone."""

EXAMPLE = """\
example:
  hvdtrain bench --model lenet --workers 1,2 --modes sync,local,independent,horovod --n-sync 10,100
"""


# Auto is not offered: a row's optimizer must not depend on its worker count
# (`optimizer_choice.BENCH_OPTIMIZER`).
BENCH_OPTIMIZERS = tuple(name for name in OPTIMIZERS if name != AUTO)
# The plain-Horovod reference (plain_horovod.py) trains SGD with momentum only.
REFERENCE_OPTIMIZER = "sgd"

# What each setup is: (flag, add_argument's keywords), in the order --help lists them.
SETUP_OPTIONS = (
    ("--synthetic-shape", dict(
        default=None, metavar="HxWxC",
        help="image shape (default: 28x28x1 for lenet, 32x32x3 for the CIFAR ResNets, "
             "224x224x3 otherwise)")),
    ("--optimizer", dict(
        default=BENCH_OPTIMIZER, metavar="{" + ",".join(BENCH_OPTIMIZERS) + "}",
        help="inner optimizer of every setup at every worker count, as `hvdtrain train "
             "--optimizer` builds it (with lamb, local mode's rounds are rescaled and travel "
             "in int4 by default, as in training); rows record it. Not auto, which would "
             "take LAMB from a global batch of 1,024 and SGD below it, so rows at different "
             "worker counts would time different optimizers. --modes horovod, bare Horovod "
             f"on SGD, needs {REFERENCE_OPTIMIZER} (default: {BENCH_OPTIMIZER})")),
    ("--modes", dict(
        default="sync,local,independent",
        help="comma-separated modes to measure, of: " + ", ".join(MODES) + ", and hlocal, "
             "hasync: hierarchical local and async (sync inside a host; with --hosts and "
             "--slots or a hostfile of several slots) (default: sync,local,independent)")),
    ("--n-sync", dict(
        default="10,100",
        help="local mode: steps between averagings, comma-separated; one setup each; "
             "default: the period hvdtrain train settles for each job; a rule (auto, qsr, "
             "link, as `hvdtrain train --n-sync` takes them): its rounds come as the rule "
             "sets them in the timed run, and the row counts the run's rounds over its "
             "steps (default: 10,100)")),
    ("--round-fragments", dict(
        default="1", metavar="F[,F...]",
        help="local and async modes: one setup per value, whose rounds each average one of "
             "F fragments of the model in turn (1: the whole model); rows give the bytes of "
             "a round (bytes_per_round) and of the largest fragment's (largest_burst_bytes) "
             "(default: 1)")),
    ("--round-compression", dict(
        default=None, metavar="C[,C...]",
        help="local and async modes, timed rounds (--sync-seconds) too: one setup per value, "
             "crossed with --n-sync and --round-fragments, whose rounds travel as `hvdtrain "
             "train --round-compression` sends them (none with --fp16-allreduce: fp16), of: "
             + ", ".join(ROUND_COMPRESSIONS) + ". Rows record it. A compressed row's "
             "bytes_per_round (and largest_burst_bytes) count what a worker hands to a "
             "round: int8 codes, one byte a value (int4: half a byte), plus a float32 scale "
             "per chunk of at most 1,024 values; topk, a code and a place byte for each of "
             "the 8 largest of every 256 values and a scale; or fp16, two bytes a value; "
             "padded to one whole shard per worker (default: training's, per setup: "
             f"{DEFAULT_ROUND_COMPRESSION['local']} in local mode, "
             f"{RESCALED_ROUND_COMPRESSION} for its rescaled rounds (--optimizer lamb), "
             f"{DEFAULT_ROUND_COMPRESSION['async']} in async mode)")),
    ("--bucket-mb", dict(
        default=DEFAULT_BUCKET_MB, metavar="SPEC[,SPEC...]",
        help="sync mode: how gradients are grouped for allreduce, one setup per value: auto "
             "(about 8 groups of the model's gradients), auto:K (K groups), or a size in MB "
             f"(25; 0: one group) (default: {DEFAULT_BUCKET_MB})")),
    ("--sync-seconds", dict(
        default=None, metavar="T[,T...]",
        help="local and async modes: also one setup per value with rounds every T seconds "
             "of each worker's wall time instead of every --n-sync steps, so a faster worker "
             "takes more steps (default: none)")),
)
# How and where the setups are measured; --hosts and --slots come after these.
JOB_OPTIONS = (
    ("--workers", dict(
        default=None,
        help="worker counts, comma-separated, one job each (default: 1, or the job's own "
             "size under horovodrun)")),
    ("--hostfile", dict(
        default=None,
        help="horovodrun hostfile (lines 'host slots=N'); jobs take its first K slots "
             "(default: all workers on this machine)")),
    ("--steps", dict(
        type=int, default=50,
        help="timed steps per setup, rounded up to whole --n-sync periods in local mode "
             "(default: 50)")),
    ("--warmup-steps", dict(
        type=int, default=10,
        help="steps run before timing starts: tracing, pipeline start-up (default: 10)")),
    ("--window", dict(
        type=int, default=10,
        help="steps per window for the 95%% intervals of a single measurement (default: 10)")),
    ("--repeats", dict(
        type=int, default=1,
        help="measure every setup this many times, taking turns; rates are then the mean "
             "and the 95%% intervals come from the spread between repeats (default: 1)")),
    ("--link-rate", dict(
        default=None, metavar="RATE",
        help="run each job in a private network namespace whose loopback is shaped to RATE "
             "(tc units: 10gbit, 1gbit, 100mbit), to emulate links between nodes, zones or "
             "regions; needs root (default: the unshaped loopback)")),
)
# How each worker of a job runs, and where the results go.
WORKER_OPTIONS = (
    ("--slow-rank", dict(
        default=None, metavar="RANK:FACTOR",
        help="make one worker's steps FACTOR times slower (1:2: rank 1 at half speed), as "
             "a slower GPU or a noisy neighbour would; rounds and allreduces are not slowed "
             "(default: all at full speed)")),
    ("--pin-cores", dict(
        action="store_true",
        help="give each worker of a machine its own equal share of the cores (all its "
             "threads, Horovod's too), as each would own a GPU; without it a waiting or "
             "--slow-rank worker lends its cores to the others (default: workers share all "
             "cores)")),
    ("--host-data", dict(
        action="store_true",
        help="feed the synthetic images through an in-memory tf.data pipeline (default: one "
             "random batch per worker, made and kept on its device, so that no "
             "host-to-device copy is timed)")),
    ("--out", dict(
        default=None,
        help="folder for bench.json, bench.csv and job logs (default: "
             "runs/bench-<time>-<model>)")),
)


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "bench", help="training throughput and scaling on synthetic data",
        description=DESCRIPTION, epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(parser, CONFIG_OPTIONS)
    for flag, keywords in SETUP_OPTIONS + JOB_OPTIONS:
        parser.add_argument(flag, **keywords)
    add_hosts_option(parser, "job", "; --workers defaults to N")
    for flag, keywords in WORKER_OPTIONS:
        parser.add_argument(flag, **keywords)
    parser.set_defaults(handler=run)


def parse_bucket_list(text: str) -> list[str]:
    """'25,auto' -> ['25', 'auto'], each a valid --bucket-mb spec (hvdtrain.buckets)."""
    specs = [part.strip() for part in str(text).split(",")]
    for spec in specs:
        try:
            parse_bucket_spec(spec)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return specs


def parse_slow_rank(text: str | None) -> tuple[int, float] | None:
    """'1:2' -> (1, 2.0): rank 1's steps twice as slow."""
    if not text:
        return None
    try:
        rank, factor = text.split(":")
        parsed = int(rank), float(factor)
    except ValueError:
        parsed = None
    if parsed is None or parsed[0] < 0 or not parsed[1] >= 1:
        raise ConfigError(f"--slow-rank must be RANK:FACTOR with a factor of at least 1 "
                          f"(1:2 makes rank 1's steps twice as slow), got {text!r}")
    return parsed


def _setups(args, cfg) -> list[dict]:
    if min(args.steps, args.warmup_steps, args.window, args.repeats) <= 0:
        raise ConfigError(f"--steps, --warmup-steps, --window and --repeats must be positive, got "
                          f"{args.steps}, {args.warmup_steps}, {args.window} and {args.repeats}")
    shape = args.synthetic_shape or DEFAULT_SHAPES.get(cfg.model, "224x224x3")
    parse_shape(shape)
    slow = parse_slow_rank(args.slow_rank)
    common = dict(model=cfg.model, batch_size=cfg.batch_size, shape=shape, steps=args.steps,
                  warmup_steps=args.warmup_steps, window=args.window, seed=cfg.seed, xla=cfg.xla,
                  mixed_precision=cfg.mixed_precision, fp16_allreduce=cfg.fp16_allreduce,
                  data="host" if args.host_data else "device",
                  optimizer=_bench_optimizer(args.optimizer),
                  slow_rank=slow[0] if slow else None, slow_factor=slow[1] if slow else 1.0)
    periods = parse_seconds_list(args.sync_seconds, "--sync-seconds") if args.sync_seconds else []
    bucket_specs = parse_bucket_list(args.bucket_mb)
    fragments = parse_int_list(args.round_fragments, "--round-fragments")
    compressions = _round_compressions(args.round_compression, cfg.fp16_allreduce)
    setups = []
    for name in _modes(args.modes, args.optimizer):
        mode, hierarchical = HIERARCHICAL_OF.get(name, name), name in HIERARCHICAL_OF
        local = mode in LOCAL_MODES
        n_syncs = _periods(args.n_sync) if local else [None]
        buckets = bucket_specs if mode == "sync" else [bucket_specs[0]]
        counts, codings = (fragments, compressions) if local else ([1], ["none"])
        setups += [dict(common, mode=mode, n_sync=n, bucket_mb=b, hierarchical=hierarchical,
                        round_fragments=f, round_compression=c)
                   for n in n_syncs for b in buckets for f in counts for c in codings]
        if local and not hierarchical:  # timed rounds refuse the hierarchy and fragments
            setups += [dict(common, mode=mode, n_sync=None, sync_seconds=t, round_compression=c)
                       for t in periods for c in compressions]
    return setups


def _periods(text: str) -> list[int | str]:
    """--n-sync's periods: each a number of steps, `default` (what each job's plan
    settles), or a rule that sets the period at rounds (auto, qsr, link)."""
    words = [word.strip() for word in str(text).split(",")]
    named = [word == TRAINS_DEFAULT or is_rule(word) for word in words]
    numbers = ",".join(word for word, kept in zip(words, named) if not kept)
    try:
        counts = iter(parse_int_list(numbers, "--n-sync") if numbers else [])
    except ConfigError:
        raise ConfigError(f"--n-sync takes steps, default or a rule (auto, qsr, link), "
                          f"comma-separated; got {text!r}") from None
    return [word if kept else next(counts) for word, kept in zip(words, named)]


def _round_compressions(text: str | None, fp16_allreduce: bool) -> list[str | None]:
    """--round-compression's values, each once. [None] when not given: each setup's run
    takes its mode's default from the config (`TrainConfig.resolved`), as `hvdtrain train`
    does, and the job records what that was (`throughput.as_planned`)."""
    if text is None:
        return [None]
    # As `hvdtrain train` sends them: --fp16-allreduce's uncompressed rounds go as fp16.
    return list(dict.fromkeys(rounds_compression(c, fp16_allreduce) for c in parse_choice_list(
        text, "--round-compression", ROUND_COMPRESSIONS)))


def _bench_optimizer(name: str) -> str:
    if name not in BENCH_OPTIMIZERS:
        raise ConfigError(f"--optimizer must be one of {', '.join(BENCH_OPTIMIZERS)} (one "
                          f"optimizer at every worker count, so not {AUTO}), got {name!r}")
    return name


def _modes(text: str, optimizer: str) -> list[str]:
    """--modes, each once; the plain-Horovod reference only beside setups of its optimizer,
    since its ratio to sync mode is read as hvdtrain's overhead."""
    modes = list(dict.fromkeys(parse_choice_list(text, "--modes", (*MODES, *HIERARCHICAL_OF))))
    if "horovod" in modes and optimizer != REFERENCE_OPTIMIZER:
        raise ConfigError(f"--modes horovod times bare Horovod on {REFERENCE_OPTIMIZER}, got "
                          f"--optimizer {optimizer}: leave horovod out of --modes, or give "
                          f"--optimizer {REFERENCE_OPTIMIZER}")
    return modes


def run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in CONFIG_OPTIONS if hasattr(args, name)}
    cfg = load_config(None, overrides)
    setups = _setups(args, cfg)
    workers = parse_int_list(args.workers, "--workers") if args.workers else None
    slow_rank = setups[0]["slow_rank"]
    if slow_rank is not None and workers and slow_rank >= min(workers):
        raise ConfigError(f"--slow-rank {args.slow_rank} names a rank the {min(workers)}-worker "
                          f"job does not have")
    if "HOROVOD_RANK" in os.environ:
        if args.link_rate or args.hosts is not None:
            flag = "--hosts" if args.hosts is not None else "--link-rate"
            raise ConfigError(f"{flag} starts its own jobs: run hvdtrain bench without "
                              "horovodrun around it")
        return _measure_this_job(args, setups, workers)
    workers = check_where(args, workers)
    out = args.out or _default_out(cfg.model)
    os.makedirs(out, exist_ok=True)
    plan_path = os.path.join(out, "plan.json")
    with open(plan_path, "w", encoding="utf-8") as fh:
        json.dump({"setups": setups, "repeats": args.repeats, "pin_cores": args.pin_cores},
                  fh, indent=2)
    rows, host = [], {}
    for count in workers or [1]:
        results_path = os.path.join(out, f"results-w{count}.json")
        log_path = os.path.join(out, f"bench-w{count}.log")
        print(f"hvdtrain: benchmarking {cfg.model} on {count} worker(s); log: {log_path}", flush=True)
        # Through hvdtrain.quiet: the job imports TensorFlow first thing, and its workers'
        # start-up notices would fill the log.
        command = [sys.executable, "-m", "hvdtrain.quiet", "-m", "hvdtrain.benchmarks.throughput",
                   plan_path, results_path]
        result = run_job(job_command(args, count, command), log_path)
        if result.returncode != 0 or not os.path.exists(results_path):
            raise HvdtrainError(f"the {count}-worker benchmark job failed (exit "
                                f"{result.returncode}); see {log_path}")
        with open(results_path, encoding="utf-8") as fh:
            results = json.load(fh)
        rows += results["rows"]
        host = results["machine"]
    where = topology(args.hosts, args.link_rate, args.hostfile, args.slots)
    _report(rows, host, out, args.link_rate, where)
    return 0


def _default_out(model: str) -> str:
    return os.path.join("runs", f"bench-{time.strftime('%Y%m%d-%H%M%S')}-{model}")


def _measure_this_job(args, setups, workers) -> int:
    from hvdtrain import comm
    from hvdtrain.benchmarks.throughput import Setup, run_setups, start_job

    measured = [Setup(**s) for s in setups]
    start_job(measured, args.pin_cores)
    if workers and workers != [comm.size()]:
        raise ConfigError(f"--workers {args.workers} under horovodrun, which started "
                          f"{comm.size()}; leave --workers out, or run bench without horovodrun")
    rows, host = run_setups(measured, args.repeats, args.pin_cores)
    if comm.is_chief():
        out = args.out or _default_out(setups[0]["model"])
        os.makedirs(out, exist_ok=True)
        _report(rows, host, out)
    return 0


CSV_COLUMNS = ("model", "label", "mode", "n_sync", "sync_seconds", "workers", "batch_per_worker", "shape",
               "optimizer",
               "total_images_per_sec", "total_ci95", "per_worker_images_per_sec", "per_worker_ci95",
               "speedup", "efficiency", "step_seconds", "communication_share", "bytes_per_step",
               "seconds_per_exchange", "round_share", "timed_steps", "repeats", "parameters",
               "hierarchical", "hosts", "bytes_within_host_per_step", "round_fragments",
               "round_compression", "bytes_per_round", "largest_burst_bytes")


def _report(rows: list[dict], host: dict, out: str, link_rate: str | None = None,
            where: dict | None = None) -> None:
    """Scaling columns, then bench.json, bench.csv and a table on stdout."""
    from hvdtrain.files import write_csv, write_json

    add_scaling(rows)
    overhead = overhead_against_reference(rows)
    write_json(os.path.join(out, "bench.json"), {
        "command": ["hvdtrain", *sys.argv[1:]], "machine": host, "rows": rows,
        # None: the unshaped loopback of one machine (several GB/s).
        "link_rate": link_rate, "topology": where or topology(None, link_rate),
        "horovod_reference_over_sync": {str(k): {"overhead": v, "ci95": ci}
                                        for k, (v, ci) in overhead.items()},
        "sync_over_horovod": [{"workers": k, "label": label, "ratio": v, "ci95": ci}
                              for (k, label), (v, ci) in ratios_to_reference(rows).items()]})
    write_csv(os.path.join(out, "bench.csv"), rows, CSV_COLUMNS)
    where = where or topology(None, link_rate)
    nics = f", a NIC per worker on {len(where['hosts'])} emulated hosts" if "hosts" in where else ""
    print(f"link: {link_rate or 'unshaped loopback'}{nics}; optimizer: "
          f"{', '.join(dict.fromkeys(str(r.get('optimizer')) for r in rows))}")
    print(format_table(rows))
    for count, (ratio, ci) in overhead.items():
        print(f"plain Horovod vs hvdtrain sync, {count} worker(s): {ratio:+.1%} ± {ci:.1%} "
              "images/sec")
    for (count, label), (ratio, ci) in ratios_to_reference(rows).items():
        print(f"{label} / plain Horovod, {count} worker(s): {ratio:.3f}x ± {ci:.3f} (paired)")
    print(f"hvdtrain: wrote {os.path.join(out, 'bench.json')} and bench.csv", flush=True)


def format_table(rows: list[dict]) -> str:
    """Markdown: one line per (setup, workers)."""
    lines = ["| model | mode | workers | images/sec (total) | per worker | speed-up | "
             "efficiency | comm. share | in rounds | MB/step | in host MB/step |", "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['label']} | {r['workers']} | {r['total_images_per_sec']:.1f} ± "
            f"{r['total_ci95']:.1f} | {r['per_worker_images_per_sec']:.1f} ± "
            f"{r['per_worker_ci95']:.1f} | {r['speedup']:.2f}× | {r['efficiency']:.0%} | "
            f"{r['communication_share']:.1%} | {r.get('round_share', 0.0):.1%} | "
            f"{r['bytes_per_step'] / 1e6:.3f} | {r.get('bytes_within_host_per_step', 0) / 1e6:.3f} |")
    return "\n".join(lines)
