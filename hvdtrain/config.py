"""The one configuration object of a training run.

`TrainConfig` is the single source of truth: the CLI builds its options from the
field metadata below, YAML files and CLI overrides are merged into it, it is
validated once, and the resolved copy is saved as `config.yaml` in the run folder.
Everything about one option (help, choices, the modes that use it, its default in each,
whether a resumed run may change it) is in its one `_opt(...)` call.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from hvdtrain.buckets import DEFAULT_BUCKET_MB, parse_bucket_spec
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import LAMB_FROM_GLOBAL_BATCH
from hvdtrain.rounds.periods import LOCAL_MODES, PerWorkerPeriod, Period, PeriodError, parse_period
from hvdtrain.rounds.spec import ROUND_FIELDS, RoundFieldError, RoundRuleError, RoundSpec
from hvdtrain.rounds.rules import (OUTER_OPTIMIZERS, RESCALED_ROUND_COMPRESSION,  # noqa: F401
                                   ROUND_COMPRESSIONS, WARM_STARTS, rescales_by_default,
                                   rounds_compression)
from hvdtrain.schedules import LR_SCALINGS, default_max_lr

# sync averages gradients every step; the local modes, the workers' state every period.
MODES = ("sync", *LOCAL_MODES)
OPTIMIZERS = ("auto", "sgd", "adam", "lars", "lamb")
# How the peak rate follows the global batch, and its cap (0: none). Linear up to 0.1:
# LeNet in sync mode at a global batch of 1024 diverged or broke down at linear's 0.4 (and
# at 0.2 and 0.14 for some seeds), and at 512 one seed of three broke down at 0.2, where
# 0.1 trained at every seed (BENCHMARKS.md, "A recipe for 8 to 32 workers").
DEFAULT_LR_SCALING = "linear"
# LARS's trust coefficient (You et al. 2017).
LARS_ETA = 0.001
LR_DECAYS = ("cosine", "step", "constant")
# Async mode's default period, from time-to-accuracy runs at 2, 4 and 8 workers
# (BENCHMARKS.md, "Async mode"): every 10 local steps summed over the workers (3
# steps at 4 workers, 2 at 8), momentum not averaged; its rounds land a period late, so
# it needs a shorter period than local mode's 40 of then. Async mode takes local steps at
# no more than 4 workers' linearly scaled rate (local mode at 8: DEFAULT_LOCAL_LR_WORKERS).
# Local mode's default since 2026-11-26: int8 rounds every 2 steps, momentum kept local.
# At 2 to 32 workers and 32 or 64 examples a worker (LeNet-5) it ended above the float32
# default before it (40/workers:5) in 22 of 24 seed pairs at 2 epochs and 6 of 6 at 5
# epochs at 8 workers, within 0.5 points of sync up to 8 workers, for 0.13 of sync's
# bytes: about 2/3 of the old default's from 8 workers on, more at 2 and 4 (whose old
# period was 20 and 10 steps). ResNet-20 with BatchNorm at 8 x 64: level with sync,
# above the old default at every seed (BENCHMARKS.md, "Local mode's default at 2 to 8 workers").
DEFAULT_N_SYNC = {"local": 2, "async": "10/workers"}
# Flat local mode on LAMB (which `--optimizer auto` takes from a global batch of 1,024)
# rounds every step. Over 5 epochs (LeNet-5, 3 seeds) every step ended 0.68 points above
# every 2 steps at 32 x 32, at every seed, and 0.26 below sync, where every 2 steps ended
# 0.94 below; at 16 x 64 0.39 below sync (every 2: 0.54); at 32 x 64 0.66 below (7 seeds;
# every 2: 1.24, 3 seeds). It moves 0.251 of sync's bytes (int8 values and their scales,
# momentum kept local) where every 2 steps moved 0.128; the quadratic synchronization rule
# (qsr:1) ended below both (BENCHMARKS.md, "Local mode at 16 and 32 workers: its rate and
# its rounds"). Rescaled (below), every 2 steps ended 1.97 below sync at 32 x 64 where every
# step ended level (3 seeds): rounds stay every step, and int4 halves their bytes.
DEFAULT_LOCAL_LAMB_N_SYNC = 1
# Async mode's rounds travel as its float32 default measured at 2 to 8 workers where its
# period is longer than a step. Where the period comes to one step (10/workers from 10
# workers on), float32 rounds would move sync's bytes every step, so the plan settles int8
# there (`plan.settle`, which knows the job): at 16 x 64 (LeNet-5, 2 epochs, seeds 1 to 3)
# int8 every step ended -0.17 +- 0.23 points from float32 every step (paired), level within
# the interval, at 0.251 of its bytes; float32 every 2 steps, half the bytes, ended
# 1.36 +- 1.01 points below it (BENCHMARKS.md, "Async mode at 16 workers").
ASYNC_ONE_STEP_COMPRESSION = "int8"
DEFAULT_ROUND_COMPRESSION = {"sync": "none", "local": "int8", "async": "none"}
# The hierarchy's period in local mode is flat local mode's, 2 steps, since its rounds are
# cut in host shards (hvdtrain.keras.host_shards): a worker hands over a k-th of flat's
# bytes at hosts of k, and a host's NIC carries 0.63 (hosts of 2) and 0.35 (hosts of 4)
# of flat's round bytes at 8 workers over Gloo. At 8 workers (LeNet-5, 2 epochs, 10 seeds)
# it ended level with flat local's default (-0.05 and -0.08 points, +-0.4); the default
# before it, 40/hosts:5 (10 and 20 steps), ended 0.56 and 0.31 below (3 seeds). Longer
# periods are the user's trade (BENCHMARKS.md). Async keeps 10/hosts: not measured since.
DEFAULT_HOST_N_SYNC = {"local": 2, "async": "10/hosts"}
# How many workers the rate rule counts for local steps. Local mode counts 8: at 16 x 32
# over 5 epochs (LeNet-5, 3 seeds) it ended 0.74 points above 4 at every seed and level
# with sync (-0.13); at 8 x 32 level with sync too; where the peak cap binds (from a local
# batch of 64 at 8 workers, LAMB's from 1,024) nothing changes. Counting all 8 at 8 x 64
# diverged before the cap existed (docs/benchmarks/history.md). Async keeps 4: its rounds
# land a period late, and it was not measured at 8.
DEFAULT_LOCAL_LR_WORKERS = {"local": 8, "async": 4}
# The names `hvdtrain.data.load_dataset` and `hvdtrain.models.build_model` accept, kept here
# so a typo is caught before TensorFlow is imported (tests check they match the registries).
DATASETS = ("fashion-mnist", "cifar10", "imagenet", "image-folder", "synthetic",
            "synthetic-device")
MODELS = ("alexnet", "alexnet-lrn", "alexnet-2col", "lenet", "resnet50", "resnet20", "resnet32",
          "resnet56")
# Each model's BatchNorm moving statistics (means and variances) as a share of its trainable
# values, at 10 classes: the plan counts them in a round's bytes, since coarse rounds send
# them in float32 (`hvdtrain.rounds.payload.WHOLE_STATISTICS`). Models without BatchNorm
# have none. tests/test_models.py checks them against the built models.
STATISTICS_SHARE = {"resnet20": 0.00511, "resnet32": 0.00490, "resnet56": 0.00477,
                    "resnet50": 0.00226}


# A run folder's config.yaml carries the version of its layout (files without one are 1).
# 2: every option added since declares what runs did before it existed (`before=`).
CONFIG_SCHEMA = 2
SCHEMA_KEY = "schema"
# `_opt(before=...)` left unset: nothing is known of runs saved before the option existed.
UNDECLARED = object()


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, *,
         resumable: bool = False, modes: tuple[str, ...] = MODES, elsewhere: str = "refused",
         default_per_mode: Mapping[str, Any] | None = None, before: Any = UNDECLARED):
    """One option and every rule about it, as argparse's add_argument keeps them in one call.

    resumable: may differ between a run and its resumption: it changes where files are,
      how often things are written or how fast training goes, not what is learned.
    modes: the modes that use it. In another mode it is `elsewhere`: "refused" unless it
      keeps `default` (the value that leaves it unused), or "ignored" whatever its value
      (a run of that mode may also resume under another value).
    default_per_mode: the default in each mode, made concrete by `TrainConfig.resolved`
      (`default` is then None) and shown by the command's help.
    before: what runs saved before the option existed trained with, which a run folder's
      config.yaml without it resumes under (a resumable option needs none: its default is
      harmless). Every option added from schema 2 on declares it; `tests/test_config.py`
      fails on one that does not.
    """
    if elsewhere not in ("refused", "ignored"):
        raise ValueError(f"elsewhere must be 'refused' or 'ignored', got {elsewhere!r}")
    return field(default=default, metadata={
        "help": help, "choices": choices, "resumable": resumable, "modes": modes,
        "elsewhere": elsewhere, "default_per_mode": dict(default_per_mode or {}),
        "before": before})


@dataclass
class TrainConfig:
    # What to train on.
    model: str = _opt("lenet", "the model (hvdtrain.models)", MODELS)
    dataset: str = _opt(
        "fashion-mnist", "the dataset (synthetic: random images)", DATASETS)
    data_dir: str | None = _opt(
        None, "folder holding the dataset files (default: the dataset's standard path)",
        resumable=True)
    train_examples: int | None = _opt(
        None, "train on the first N examples only; imagenet: take N as the number of "
              "training records (default: all)")
    synthetic_shape: str = _opt(
        "28x28x1", "image shape HxWxC of the synthetic dataset")
    image_size: int = _opt(
        224, "side of the square crops fed to the model, for imagenet and image-folder")

    # How long.
    epochs: int = _opt(2, "number of epochs")
    steps_per_epoch: int | None = _opt(
        None, "cap on steps per epoch (default: one pass over each worker's shard)")
    batch_size: int = _opt(64, "batch size per worker; the global batch is this times the "
                               "workers")

    # Optimisation.
    optimizer: str = _opt(
        "auto", "auto: lamb in sync mode from a global batch of "
                f"{LAMB_FROM_GLOBAL_BATCH} and in flat local mode, else sgd; a resumed run "
                "keeps its own", OPTIMIZERS)
    base_lr: float = _opt(
        0.1, "learning rate for a global batch of 256, scaled to the real one by "
             "--lr-scaling")
    lr_scaling: str = _opt(
        DEFAULT_LR_SCALING,
        "how the peak rate follows the global batch B: linear, x B/256; sqrt, x sqrt(B/256);"
        " none",
        LR_SCALINGS, before="linear")
    max_lr: float | None = _opt(
        None, "cap on the peak rate after --lr-scaling (0: none)",
        before=0.0)  # runs saved before the cap took the linear rule uncapped
    warmup_epochs: float = _opt(
        1.0, "epochs over which the rate ramps linearly from one worker's rate to the peak")
    local_lr_workers: int | None = _opt(
        None,
        "local and async modes: --lr-scaling counts at most this many workers (0: all of "
        "them)",
        modes=LOCAL_MODES, default_per_mode=DEFAULT_LOCAL_LR_WORKERS)
    lr_decay: str = _opt("cosine", "decay after warmup", LR_DECAYS)
    momentum: float = _opt(0.9, "momentum of SGD and LARS (0 for none)")
    lars_eta: float = _opt(
        LARS_ETA, "--optimizer lars: the trust coefficient", before=LARS_ETA)
    nesterov: bool = _opt(False, "use Nesterov momentum with SGD")
    weight_decay: float = _opt(
        0.0, "decoupled weight decay applied by the optimizer (biases and BatchNorm "
             "excluded)")
    seed: int = _opt(42, "random seed for weights, shuffling and dropout")

    # Parallelism.
    mode: str = _opt(
        "sync", "sync: average gradients every step; local: average weights every --n-sync "
                "steps; async: local, each round behind the next steps",
        MODES)
    n_sync: int | str | None = _opt(
        None,
        "steps between rounds, or a rule: N/workers, auto, qsr, link",
        modes=LOCAL_MODES, default_per_mode=DEFAULT_N_SYNC)
    sync_seconds: float | None = _opt(
        None, "local and async modes: a round every T seconds of each worker's wall time "
              "instead of every --n-sync steps")
    warm_start_steps: int = _opt(
        0, "local mode: steps of a warm start before going local (see --warm-start)",
        modes=LOCAL_MODES)
    warm_start: str = _opt(
        "sync", "local mode: how --warm-start-steps train. sync: gradients averaged every "
                "step; single: rank 0 alone (Paine et al. 2013)", WARM_STARTS,
        modes=LOCAL_MODES)
    epoch_rounds: bool = _opt(
        True, "local mode: a round at every epoch end and before every evaluation; off: "
              "rounds only every --n-sync steps", modes=("local",))
    init_weights: str | None = _opt(
        None, "start from these weights (.weights.h5), e.g. a one-worker warm start",
        resumable=True)
    average_bn_stats: bool = _opt(
        True, "local mode: average BatchNorm moving statistics at each round")
    average_optimizer_state: bool = _opt(
        False, "local and async modes: also average optimizer slots (momentum, Adam moments)"
               " at each round",
        modes=LOCAL_MODES)
    outer_optimizer: str = _opt(
        "none", "local mode: update applied to the averaged weights", OUTER_OPTIMIZERS,
        modes=LOCAL_MODES)
    outer_lr: float = _opt(
        1.0, "outer learning rate (alpha of SlowMo); 1.0 with momentum 0 is plain averaging",
        modes=LOCAL_MODES)
    outer_momentum: float = _opt(0.0, "outer momentum (beta of SlowMo)", modes=LOCAL_MODES)
    rescale_rounds: bool | None = _opt(
        None, "local mode: stretch each round's mean step to the workers' mean step length",
        # Off where unused, so that a sweep's sync run can put it back (`refused_in`).
        modes=("local",), default_per_mode={"sync": False, "async": False}, before=False)
    round_compression: str | None = _opt(
        None, "how rounds travel (configuration.md says each form)",
        # Async's default depends on the job's period: settled by `plan.settle`.
        ROUND_COMPRESSIONS, modes=LOCAL_MODES,
        default_per_mode={m: c for m, c in DEFAULT_ROUND_COMPRESSION.items() if m != "async"},
        # Rounds before it travelled as they were (fp16 with --fp16-allreduce).
        before="none")
    round_fragments: int = _opt(
        1, "local and async modes: average one of F fragments of the state a round "
           "(Streaming DiLoCo)",
        modes=LOCAL_MODES, before=1)
    merge_after: int | None = _opt(
        None, "async mode: take each round's mean this many steps after it starts "
              "(Streaming DiLoCo's tau) instead of at the next round",
        modes=("async",), before=None)
    hierarchical_sgd: bool = _opt(
        False, "local and async modes: sync inside each host, local SGD across hosts; period"
               f" {DEFAULT_HOST_N_SYNC['local']} steps in local mode, "
               f"{DEFAULT_HOST_N_SYNC['async']} in async",
        modes=LOCAL_MODES)

    pin_cores: bool = _opt(
        False, "give each worker on a machine its own equal share of the CPU cores", resumable=True)
    model_parallel: int = _opt(
        1, "devices each worker splits its model over: 2 for alexnet-2col")

    deterministic: bool = _opt(
        False, "repeatable runs: Horovod's tensor fusion off, so identical runs repeat "
               "bitwise on CPU (slower)",
        resumable=True)  # it changes only how sums round

    # Speed.
    mixed_precision: bool = _opt(
        False, "Keras mixed_float16 policy with loss scaling (for GPUs; slow on most CPUs)")
    xla: bool = _opt(
        False, "compile with XLA (on CPU also set TF_XLA_FLAGS=--tf_xla_cpu_global_jit)")
    fp16_allreduce: bool = _opt(
        False, "send gradients, and rounds without --round-compression, as float16")
    bucket_mb: str = _opt(
        DEFAULT_BUCKET_MB, "sync mode: average gradients in groups, last layers first: auto,"
                           " auto:K groups, or MB (0: one group)", resumable=True)

    # Output and fault tolerance.
    out: str | None = _opt(None, "run folder (default: runs/<time>-<model>-<mode>)",
                           resumable=True)
    validate: bool = _opt(True, "evaluate on the test split after every epoch", resumable=True)
    eval_every: int = _opt(
        0, "also evaluate every N steps within epochs, after a round (0: never)")
    eval_examples: int | None = _opt(
        None, "--eval-every evaluates the test split's first this many examples (default: "
              "all of it)")
    checkpoint_every: str = _opt(
        "1epoch", "checkpoint interval: N steps (500, 500steps) or N epochs (2e, 2epochs)",
        resumable=True)
    keep_checkpoints: int = _opt(3, "how many of the newest checkpoints to keep", resumable=True)
    resume: str = _opt(
        "auto", "auto: continue from the run folder's newest sound checkpoint; never: refuse"
                " a folder that holds a run; or a checkpoint folder",
        resumable=True)
    elastic: bool = _opt(
        False, "keep going when workers leave or join (horovodrun --min-np/--max-np); needs "
               "--out")
    elastic_commit_every: int = _opt(
        50, "elastic: steps between in-memory commits, where a lost worker rolls back to")
    log_every: float = _opt(
        30.0, "seconds between rank 0's progress lines when the output is not a terminal; 0:"
              " none",
        resumable=True)
    divergence_guard: bool = _opt(
        True, "stop a run whose loss is not finite or far above where it started, in one "
              "line naming the step", resumable=True)
    step_timeout: float = _opt(
        600.0, "seconds without a finished step before a worker ends the job; 0: never",
        resumable=True)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save_yaml(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump({SCHEMA_KEY: CONFIG_SCHEMA, **self.to_dict()}, fh, sort_keys=False)

    def resolved(self) -> "TrainConfig":
        """The defaults that depend on the mode made concrete: what a run uses and saves."""
        changes = {f.name: f.metadata["default_per_mode"][self.mode]
                   for f in dataclasses.fields(self)
                   if getattr(self, f.name) is None and self.mode in f.metadata["default_per_mode"]}
        if self.rescale_rounds is None and self.mode == "local" and self.optimizer != "auto":
            changes["rescale_rounds"] = _rescales_by_default(self)
        if self.max_lr is None and self.optimizer != "auto":  # set once auto has chosen
            changes["max_lr"] = default_max_lr(
                self.optimizer, self.mode, self.hierarchical_sgd, self.average_optimizer_state,
                bool(changes.get("rescale_rounds", self.rescale_rounds)))
        if self.n_sync is None and self.mode == "local" and not self.hierarchical_sgd:
            changes["n_sync"] = _flat_local_period(self.optimizer)
        if self.round_compression is None and self.mode == "local":
            changes["round_compression"] = _local_compression(
                self.optimizer, changes.get("rescale_rounds", self.rescale_rounds))
        if self.hierarchical_sgd and self.n_sync is None:
            # A host's workers hold one model: the replicas that drift apart are the hosts.
            changes["n_sync"] = DEFAULT_HOST_N_SYNC[self.mode]
        return dataclasses.replace(self, **changes) if changes else self

    def validate_values(self) -> "TrainConfig":
        """Raise ConfigError naming the first bad option and its value."""
        _check_numbers(self)
        _check_formats(self)
        _check_choices(self)
        _check_mode_options(self)
        _check_dependent_options(self)
        if self.sync_seconds is not None:
            _check_timed(self)
        if self.mode in LOCAL_MODES:
            _check_round_rules(self)
        _check_hierarchical(self)
        return self


# Options that may differ between a run and its resumption (the number of workers is not
# an option: progress is kept in examples, so any -np can continue a run).
RESUMABLE_CHANGES = frozenset(f.name for f in dataclasses.fields(TrainConfig)
                              if f.metadata["resumable"])


def ignored_in(mode: str) -> frozenset[str]:
    """Options `mode` ignores whatever their values (so a run may resume under others)."""
    return frozenset(f.name for f in dataclasses.fields(TrainConfig)
                     if mode not in f.metadata["modes"] and f.metadata["elsewhere"] == "ignored")


def _rescales_by_default(cfg: TrainConfig) -> bool:
    return rescales_by_default(cfg.optimizer, cfg.hierarchical_sgd, cfg.round_fragments,
                               cfg.average_optimizer_state)


def _flat_local_period(optimizer: str) -> int | None:
    """Flat local mode's default period: every step on LAMB, else every 2 steps; None while
    `--optimizer auto` has not chosen (`hvdtrain.plan.settle` chooses)."""
    if optimizer == "auto":
        return None
    return DEFAULT_LOCAL_LAMB_N_SYNC if optimizer == "lamb" else DEFAULT_N_SYNC["local"]


def _local_compression(optimizer: str, rescale_rounds: bool | None) -> str | None:
    """Local mode's default round compression: int4 for rescaled rounds, else int8; None
    while `--optimizer auto` has not chosen (rescaling follows the optimizer)."""
    if optimizer == "auto":
        return None
    return RESCALED_ROUND_COMPRESSION if rescale_rounds else DEFAULT_ROUND_COMPRESSION["local"]


def refused_in(mode: str) -> tuple[tuple[str, Any], ...]:
    """Options `mode` does not use, each with the value that leaves it unused (its default,
    or the mode's own where it has one: sync's round compression is none): a run of `mode`
    refuses any other, and a sweep's runs put them back to it."""
    return tuple((f.name, f.metadata["default_per_mode"].get(mode, f.default))
                 for f in dataclasses.fields(TrainConfig)
                 if mode not in f.metadata["modes"] and f.metadata["elsewhere"] == "refused")


def _check_numbers(cfg: TrainConfig) -> None:
    """Each number within its range; None, for the options that take it, leaves one unset."""
    for check, names in (
            (_positive_int, ("epochs", "batch_size", "image_size", "keep_checkpoints",
                             "model_parallel", "elastic_commit_every", "round_fragments")),
            (_non_negative_int, ("warm_start_steps", "eval_every", "seed")),
            (_positive_float, ("base_lr", "outer_lr", "lars_eta")),
            (_non_negative_float, ("step_timeout", "log_every", "warmup_epochs", "weight_decay")),
            (_fraction, ("momentum", "outer_momentum"))):
        for name in names:
            check(cfg, name)
    for name in ("steps_per_epoch", "train_examples", "eval_examples", "merge_after"):
        if getattr(cfg, name) is not None:
            _positive_int(cfg, name)
    if cfg.local_lr_workers is not None:
        _non_negative_int(cfg, "local_lr_workers")
    if cfg.max_lr is not None:
        _non_negative_float(cfg, "max_lr")


def _check_formats(cfg: TrainConfig) -> None:
    """The options written in a small language of their own: each must parse."""
    n_sync_period(cfg)
    parse_interval(cfg.checkpoint_every)
    _bucket_spec(cfg)
    parse_shape(cfg.synthetic_shape)


def _check_choices(cfg: TrainConfig) -> None:
    for f in dataclasses.fields(cfg):
        choices, value = f.metadata["choices"], getattr(cfg, f.name)
        if value is None and f.default is None:  # made concrete per mode by `resolved`
            continue
        if choices is not None and value not in choices:
            raise ConfigError(f"{option_flag(f.name)} must be one of {', '.join(choices)}, "
                              f"got {getattr(cfg, f.name)!r}")


def _check_mode_options(cfg: TrainConfig) -> None:
    """An option the mode does not use must keep the value that leaves it unused."""
    for name, unused in refused_in(cfg.mode):
        # None: not given, made `unused` by `resolved`.
        value = getattr(cfg, name)
        if value not in (unused, None):
            modes = " or ".join(_field(name).metadata["modes"])
            given = option_flag(name) if value is True else f"{option_flag(name)} {value}"
            raise ConfigError(f"{option_flag(name)} needs --mode {modes}, got {given} with "
                              f"--mode {cfg.mode}")


def _check_dependent_options(cfg: TrainConfig) -> None:
    """Options that need a value of another, refused in one line each."""
    if cfg.model_parallel not in (1, 2):
        raise ConfigError(f"--model-parallel must be 1 or 2, got {cfg.model_parallel}")
    if cfg.model_parallel == 2 and cfg.model != "alexnet-2col":
        raise ConfigError(f"--model-parallel 2 needs --model alexnet-2col, got --model {cfg.model}")
    if cfg.elastic and not cfg.out:
        raise ConfigError("--elastic needs --out: workers that join later must find the run folder")
    if cfg.nesterov and (cfg.optimizer not in ("sgd", "auto") or cfg.momentum == 0):
        raise ConfigError("--nesterov needs --optimizer sgd with --momentum > 0, "
                          f"got --optimizer {cfg.optimizer} --momentum {cfg.momentum}")
    if cfg.lars_eta != LARS_ETA and cfg.optimizer != "lars":
        raise ConfigError(f"--lars-eta needs --optimizer lars, got --lars-eta "
                          f"{cfg.lars_eta} with --optimizer {cfg.optimizer}")


def round_spec(cfg: TrainConfig) -> RoundSpec:
    """The round choices of a local or async run (`hvdtrain.rounds.spec`), which the Keras
    layer takes and whose rules the CLI shares with it; a bad one refused in one line
    naming its flag. Each is the option of its name (`_OPTION_OF` names the others), but
    overlap, which is --mode async, and how rounds travel, which --fp16-allreduce joins."""
    given = {field: getattr(cfg, _OPTION_OF.get(field, field)) for field in ROUND_FIELDS
             if field not in ("overlap", "round_compression", "fp16_allreduce")}
    try:
        return RoundSpec(
            **given, overlap=cfg.mode == "async",
            # --fp16-allreduce sends rounds as fp16 unless another compression is asked (and
            # a warm start's gradients as fp16 too: the spec's own fp16_allreduce is rounds').
            round_compression=rounds_compression(cfg.round_compression or "none",
                                                 cfg.fp16_allreduce))
    except RoundFieldError as exc:
        raise ConfigError(f"{option_flag(_OPTION_OF.get(exc.field, exc.field))} "
                          f"{exc.problem}") from None


def _check_round_rules(cfg: TrainConfig) -> None:
    try:
        round_spec(cfg).check(_as_flag)
    except RoundRuleError as exc:
        raise ConfigError(str(exc)) from None


# The round choices (RoundSpec's fields) whose option is named otherwise: the spec is built
# from them (`round_spec`) and the rules say them by their flags (`_as_flag`).
_OPTION_OF = {"hierarchical": "hierarchical_sgd"}


def _as_flag(field: str, value: Any, subject: bool) -> str:
    """A round choice as a command gives it: `--sync-seconds 2.0`, `--no-epoch-rounds`."""
    if field == "overlap":
        return "--mode async"
    flag = option_flag(_OPTION_OF.get(field, field))
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value}"


def _check_timed(cfg: "TrainConfig") -> None:
    """Rounds every T seconds: what they need, refused in one line each."""
    _positive_float(cfg, "sync_seconds")
    if cfg.mode not in LOCAL_MODES:
        raise ConfigError(f"--sync-seconds needs --mode local or async, got --mode {cfg.mode}")
    if cfg.eval_every:
        raise ConfigError(f"--eval-every {cfg.eval_every} needs the workers in step; with "
                          "--sync-seconds their steps differ (evaluate at epoch ends instead)")
    if cfg.elastic:
        raise ConfigError("--sync-seconds does not work with --elastic: the workers' steps "
                          "differ, and a commit needs them at the same one")
    _epoch_checkpoints_only(cfg, "--sync-seconds")


def _check_hierarchical(cfg: "TrainConfig") -> None:
    """What hierarchical local SGD does not do yet, and what needs it, in one line each."""
    period = n_sync_period(cfg)
    if isinstance(period, PerWorkerPeriod) and period.per == "hosts" and not cfg.hierarchical_sgd:
        raise ConfigError(f"--n-sync {cfg.n_sync} counts hosts, which only --hierarchical-sgd "
                          "averages as one model each; use N/workers")


def _epoch_checkpoints_only(cfg: "TrainConfig", what: str) -> None:
    # Between epoch ends the workers' states (and with timed rounds their steps) differ.
    if parse_interval(cfg.checkpoint_every)[0] != "epochs":
        raise ConfigError(f"{what} checkpoints at epoch ends, where the workers agree; got "
                          f"--checkpoint-every {cfg.checkpoint_every}")


def n_sync_period(cfg: TrainConfig) -> Period | None:
    """--n-sync read as a period (`hvdtrain.rounds.periods`), None when not given; a bad one
    raises ConfigError naming the flag."""
    if cfg.n_sync is None:
        return None
    try:
        return parse_period(cfg.n_sync)
    except PeriodError as exc:
        raise ConfigError(f"--n-sync {exc.problem}") from None


def parse_shape(text: str) -> tuple[int, int, int]:
    """'32x32x3' -> (32, 32, 3); raises ConfigError for anything else."""
    parts = str(text).lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) <= 0:
        raise ConfigError(f"--synthetic-shape must look like 32x32x3, got {text!r}")
    return dims  # type: ignore[return-value]


def parse_interval(text: str) -> tuple[str, int]:
    """'500' or '500steps' -> ('steps', 500); '2e' or '2epochs' -> ('epochs', 2)."""
    match = re.fullmatch(r"\s*(\d+)\s*(steps?|s|epochs?|e|ep)?\s*", str(text).lower())
    if not match or int(match.group(1)) <= 0:
        raise ConfigError("--checkpoint-every must be a positive number of steps (500, 500steps) "
                          f"or epochs (2e, 2epochs), got {text!r}")
    unit = "epochs" if (match.group(2) or "s").startswith("e") else "steps"
    return unit, int(match.group(1))


def load_config(yaml_path: str | None = None, overrides: Mapping[str, Any] | None = None
                ) -> TrainConfig:
    """Defaults, then the YAML file, then the overrides (CLI); validated."""
    values: dict[str, Any] = {}
    if yaml_path is not None:
        values.update(_read_yaml(yaml_path))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return _config_of(values)


def load_saved_config(path: str) -> TrainConfig:
    """A run folder's config.yaml, as the run trained: an option the file does not name
    (it was saved before the option existed) takes the value declared for such runs
    (`_opt(before=...)`); one with no declaration is refused, since today's default would
    pass for what the run did."""
    values = _read_yaml(path)
    unused = dict(refused_in(values.get("mode", declared_default("mode"))))
    # What the run's mode never read is read as unused: older versions saved a sync run's
    # local period (10), which a command would now be refused.
    values.update({name: value for name, value in unused.items() if name in values})
    for f in dataclasses.fields(TrainConfig):
        if f.name in values or f.name in unused or f.metadata["resumable"]:
            continue
        if f.metadata["before"] is UNDECLARED:
            raise ConfigError(
                f"{path} names no {option_flag(f.name)}: it was saved by a version of "
                f"hvdtrain without that option, whose value for such runs is not known; "
                f"add `{f.name}: VALUE` to it as the run trained")
        values[f.name] = f.metadata["before"]
    return _config_of(values)


def _config_of(values: dict[str, Any]) -> TrainConfig:
    known = set(TrainConfig.field_names())
    for key in values:
        if key not in known:
            raise ConfigError(f"unknown option {key!r}")
    for key, value in values.items():
        values[key] = _coerce(key, value)
    return TrainConfig(**values).validate_values()


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:  # a folder, no permission
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option: value")
    schema = data.pop(SCHEMA_KEY, 1)
    if not isinstance(schema, int) or not 1 <= schema <= CONFIG_SCHEMA:
        raise ConfigError(f"config file {path} has {SCHEMA_KEY}: {schema!r}, which this version "
                          f"of hvdtrain does not read (it reads 1 to {CONFIG_SCHEMA}): it was "
                          f"written by a newer hvdtrain")
    known = set(TrainConfig.field_names())
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path}: unknown option {key!r}")
        values[name] = value
    return values


def _is_switch(name: str) -> bool:
    """Whether an option is on or off: `bool`, or `bool | None` when the mode decides."""
    hint = typing.get_type_hints(TrainConfig)[name]
    return hint is bool or bool in typing.get_args(hint)


def _field(name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(TrainConfig)}[name]


def declared_default(name: str) -> Any:
    """An option's default as declared, before `TrainConfig.resolved` makes it concrete."""
    return _field(name).default


def option_flag(name: str) -> str:
    """outer_lr -> --outer-lr: the option as users type it."""
    return "--" + name.replace("_", "-")


def _coerce(name: str, value: Any) -> Any:
    """Turn YAML/CLI values into the field's type; leave bad ones for validation to name."""
    default = declared_default(name)
    if value is None:
        return None
    if _is_switch(name):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{option_flag(name)} must be true or false, got {value!r}")
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if name == "n_sync":  # the CLI gives strings; a YAML file gives 100, auto or 40/workers
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(default, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"  # a number in YAML for a field that also takes words (bucket_mb)
    if isinstance(default, float) and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{option_flag(name)} must be a number, got {value!r}") from None
    return value


def _bucket_spec(cfg: TrainConfig) -> None:
    try:
        parse_bucket_spec(cfg.bucket_mb)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _positive_int(cfg: TrainConfig, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{option_flag(name)} must be a positive integer, got {value!r}")


def _non_negative_int(cfg: TrainConfig, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{option_flag(name)} must be a non-negative integer, got {value!r}")


def _number(cfg: TrainConfig, name: str) -> float:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{option_flag(name)} must be a finite number, got {value!r}")
    return float(value)


def _positive_float(cfg: TrainConfig, name: str) -> None:
    if _number(cfg, name) <= 0:
        raise ConfigError(f"{option_flag(name)} must be positive, got {getattr(cfg, name)!r}")


def _non_negative_float(cfg: TrainConfig, name: str) -> None:
    if _number(cfg, name) < 0:
        raise ConfigError(
            f"{option_flag(name)} must be zero or positive, got {getattr(cfg, name)!r}")


def _fraction(cfg: TrainConfig, name: str) -> None:
    if not 0 <= _number(cfg, name) < 1:
        raise ConfigError(f"{option_flag(name)} must be in [0, 1), got {getattr(cfg, name)!r}")


def parse_int_list(text: str, flag: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive integers, for options that take a list."""
    try:
        values = [int(part) for part in str(text).split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ConfigError(f"{flag} must be positive integers separated by commas, got {text!r}")
    return values


def parse_seconds_list(text: str, flag: str) -> list[float]:
    """'2,5' -> [2.0, 5.0]: positive, finite numbers of seconds."""
    try:
        values = [float(part) for part in str(text).split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v < float("inf") for v in values):
        raise ConfigError(f"{flag} must be positive numbers of seconds separated by commas, "
                          f"got {text!r}")
    return values


def parse_choice_list(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """'sync,local' -> ['sync', 'local'], each one of `choices`."""
    values = [part.strip() for part in str(text).split(",")]
    bad = [v for v in values if v not in choices]
    if bad:
        raise ConfigError(f"{flag} takes a comma-separated list of {', '.join(choices)}; "
                          f"got {bad[0]!r}")
    return values
