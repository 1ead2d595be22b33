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

from hvdtrain import divergence
from hvdtrain.buckets import DEFAULT_BUCKET_MB, parse_bucket_spec
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.periods import LOCAL_MODES, PerWorkerPeriod, Period, PeriodError, parse_period
from hvdtrain.rounds.spec import ROUND_FIELDS, RoundFieldError, RoundRuleError, RoundSpec
from hvdtrain.rounds.rules import (OUTER_OPTIMIZERS, RESCALED_ROUND_COMPRESSION,  # noqa: F401
                                   ROUND_COMPRESSIONS, WARM_STARTS, rescales_by_default,
                                   rounds_compression)
from hvdtrain.schedules import (DEFAULT_LOCAL_LAMB_MAX_LR, DEFAULT_MAX_LR,
                                 DEFAULT_MAX_LR_OTHERWISE, LR_SCALINGS, default_max_lr)

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
    model: str = _opt("lenet", "model name from the registry (hvdtrain.models)", MODELS)
    dataset: str = _opt(
        "fashion-mnist", "dataset name; synthetic is random images in host memory, "
        "synthetic-device one random batch per worker made and kept on its device (no input "
        "pipeline: benchmarks)", DATASETS)
    data_dir: str | None = _opt(
        None, "folder holding the dataset files (default: the dataset's standard path)",
        resumable=True)
    train_examples: int | None = _opt(
        None, "fashion-mnist, cifar10, synthetic: train on the first N examples only (quick "
              "runs and tests); imagenet: take N as the number of training records, so TFRecords "
              "without a manifest.json need not be counted (no record is dropped: an epoch is "
              "N examples of the stream)")
    synthetic_shape: str = _opt(
        "28x28x1", "image shape HxWxC of the synthetic dataset")
    image_size: int = _opt(
        224, "side of the square crops fed to the model, for imagenet and image-folder")

    # How long.
    epochs: int = _opt(2, "number of epochs")
    steps_per_epoch: int | None = _opt(
        None, "cap on steps per epoch (default: one pass over each worker's shard)")
    batch_size: int = _opt(64, "batch size per worker; the global batch is this times the workers")

    # Optimisation.
    optimizer: str = _opt(
        "auto", "inner optimizer. auto: lamb in sync mode from a global batch of 1024 "
                "(where SGD's defaults ended 3 to 11 points lower, LeNet, 3 seeds) and in "
                "local mode (about 2 points), else sgd (and with --hierarchical-sgd, "
                "--elastic or --nesterov); a resumed run keeps the one it took. "
                "sgd: with --momentum. lars: SGD with --momentum whose step for each layer is scaled "
               "by a trust ratio, --lars-eta x |weights| / (|gradient| + --weight-decay x "
               "|weights|) (You et al. 2017; biases and BatchNorm excluded), so a layer moves "
               "about rate x --lars-eta of its weights' norm per step, where SGD moves it rate "
               "x |gradient|: give it a --base-lr 10 to 30 times SGD's (LeNet at a global batch "
               "of 256 trained at 1 and 3, diverged at 10). lamb: Keras's Lamb, Adam with the "
               f"same per-layer ratio; its peak is capped at {DEFAULT_MAX_LR['lamb']:g} "
               f"({DEFAULT_LOCAL_LAMB_MAX_LR:g} in flat local mode with --no-rescale-rounds "
               "and the optimizer state kept local) unless --max-lr says "
               "otherwise. At 0.03 in sync mode it ended 3 to 4 points "
               "above SGD's defaults at a global batch of 1024 (LeNet), and level at 512 "
               "(LeNet, ResNet-20)", OPTIMIZERS)
    base_lr: float = _opt(
        0.1, "learning rate for a global batch of 256; scaled to the real global batch by "
             "--lr-scaling")
    lr_scaling: str = _opt(
        DEFAULT_LR_SCALING,
        "how the peak rate follows the global batch B: linear, --base-lr x B/256 (Goyal et "
        "al. 2017); sqrt, --base-lr x sqrt(B/256); none, --base-lr whatever B is. Warmup "
        "starts from one worker's rate under the same rule. LeNet on Fashion-MNIST at a "
        "global batch of 1024 diverged at linear's peak of 0.4, and at 0.2; 0.1 trained",
        LR_SCALINGS, before="linear")
    max_lr: float | None = _opt(
        None, f"cap on the peak rate after --lr-scaling (and on the warmup's start); 0: no "
              f"cap. Default {DEFAULT_MAX_LR['lamb']:g} with --optimizer lamb "
              f"({DEFAULT_LOCAL_LAMB_MAX_LR:g} in flat local mode with --no-rescale-rounds, "
              f"whose rounds' mean of the workers' steps is shorter than they are: 0.45 points "
              f"above 0.03 at 32 x 32 over 5 epochs; not with --rescale-rounds, on there by "
              f"default, which gives the mean step their length back, nor with "
              f"--average-optimizer-state, whose shared momentum keeps it: "
              f"0.06 there ended 5.7 points lower at 16 x 64, or diverged), else "
              f"{DEFAULT_MAX_LR_OTHERWISE:g}, which binds from a global batch of 256 (linear): "
              f"LeNet with SGD broke down above it at 512 and 1024, and LAMB at 0.1 sat at "
              f"chance where 0.03 ended above SGD at 512 and 1024",
        before=0.0)  # runs saved before the cap took the linear rule uncapped
    warmup_epochs: float = _opt(
        1.0, "epochs over which the rate ramps linearly from the one-worker rate to the scaled "
             "rate. 1 rather than 0.5: in 2-epoch LeNet runs at 8 to 32 workers it ended 0.5 to "
             "5 points higher (3 seeds each), and level at 2 workers")
    local_lr_workers: int | None = _opt(
        None,
        "local and async modes: --lr-scaling counts at most this many workers "
        "(0: all of them), since a local step trains on one worker's batch, and --max-lr "
        "caps the result. Local mode counts 8: at 16 x 32 over 5 epochs 0.74 points above "
        "4 at every seed and level with sync (LeNet-5, 3 seeds)",
        modes=LOCAL_MODES, elsewhere="ignored", default_per_mode=DEFAULT_LOCAL_LR_WORKERS)
    lr_decay: str = _opt("cosine", "decay after warmup", LR_DECAYS)
    momentum: float = _opt(0.9, "momentum of SGD and LARS (0 for none)")
    lars_eta: float = _opt(
        LARS_ETA, "--optimizer lars: the trust coefficient, the fraction of a layer's weight "
                  "norm one step at rate 1 moves it", before=LARS_ETA)
    nesterov: bool = _opt(False, "use Nesterov momentum with SGD")
    weight_decay: float = _opt(
        0.0, "decoupled weight decay applied by the optimizer (biases and BatchNorm "
             "excluded); LARS's is the paper's, added to the gradient inside its trust ratio")
    seed: int = _opt(42, "random seed for weights, shuffling and dropout")

    # Parallelism.
    mode: str = _opt(
        "sync", "sync: average gradients every step; local: average weights every --n-sync steps; "
                "async: like local, but each round's allreduce runs behind the next --n-sync "
                "steps and a worker takes the round's average plus its own progress since "
                "(CoCoD-SGD); epoch ends, evaluation and checkpoints wait for one blocking round",
        MODES)
    n_sync: int | str | None = _opt(
        None,
        "local and async modes: local steps between two weight averagings; N/workers: "
        "ceil(N / workers) steps, so the local steps between rounds summed over the workers "
        "stay N whatever -np is (40/workers: 10 steps at 4 workers, 5 at 8; 10/workers: 3 "
        "and 2); N/workers:M: the same, never below M steps (40/workers:5: 5 at 8 workers "
        "and beyond); auto: the period adapts to training, AdaComm's rule "
        "ceil(sqrt(loss / first loss) * 32) on the workers' averaged training loss since the "
        "last round, set anew at every round and never below 2 (auto:N starts from N); "
        "qsr:B:G: the quadratic synchronization rule (Gu et al. 2024), max(B, floor((G * "
        "peak / rate)^2)) steps from the workers' mean learning rate at each round, peak the "
        "highest so far: B steps while the rate is high, more as it decays (qsr:B: G = 1; "
        "qsr: B = 2); "
        "link:S:M: the period follows the link, set at every round from the workers' timed "
        "steps and rounds to the fewest steps, up to M, for which rounds take at most S% of "
        "a worker's time (link:S: M = 8; link: S = 15, M = 8), starting from 2. "
        "Flat local mode rounds every step on LAMB (which --optimizer auto takes from a "
        "global batch of 1,024), every 2 steps otherwise",
        modes=LOCAL_MODES, default_per_mode=DEFAULT_N_SYNC)
    sync_seconds: float | None = _opt(
        None, "local and async modes: average every this many seconds of each worker's wall "
              "time instead of every --n-sync steps, so a faster worker takes more steps; an "
              "epoch then ends at the first round at which the workers together have trained "
              "its examples (a little over, by less than one period)")
    warm_start_steps: int = _opt(
        0, "local mode: steps of a warm start before going local (see --warm-start)",
        modes=LOCAL_MODES)
    warm_start: str = _opt(
        "sync", "local mode: how the --warm-start-steps train. sync: gradients averaged every "
                "step (post-local SGD); single: one worker's warm start as in Paine et al. "
                "(2013), where only rank 0's progress counts and every worker then takes its "
                "state (the other workers' steps in that phase are discarded)", WARM_STARTS,
        modes=LOCAL_MODES)
    epoch_rounds: bool = _opt(
        True, "local mode: a round at every epoch end and before every evaluation, so each "
              "worker goes on from the consensus model. --no-epoch-rounds: rounds come every "
              "--n-sync steps, as in Paine et al. (2013), whatever the epochs and --eval-every, "
              "and besides only at the run's end and at every elastic commit; a checkpoint, "
              "of steps or of epochs, waits for the next round, so it holds the model "
              "training goes on from (with a period longer than the checkpoint interval, "
              "checkpoints come once a period); an "
              "evaluation sees the workers' average (one allreduce, no round) and each worker "
              "then goes on from its own weights. Needed for periods longer than an epoch: at "
              "32 workers an epoch of Fashion-MNIST is 58 steps of 32", modes=("local",))
    init_weights: str | None = _opt(
        None, "start from these weights (.weights.h5), e.g. a one-worker warm start",
        resumable=True)
    average_bn_stats: bool = _opt(
        True, "local mode: average BatchNorm moving statistics at each sync")
    average_optimizer_state: bool = _opt(
        False, "local and async modes: also average optimizer slots (momentum, Adam moments) "
               "at each round (twice a round's bytes for SGD with momentum). Off: each worker "
               "keeps its own, as SlowMo, DiLoCo and torchft do; at local mode's period of 2 "
               "steps (LeNet-5, 8 x 64, 5 epochs, 3 seeds) it ended within 0.1 points of "
               "averaging it, at half the bytes. Async mode's rounds land a period late: "
               "averaging a period-stale momentum cost async runs about 4 points at 4 workers. "
               f"With LAMB in local mode it keeps the default --max-lr at "
               f"{DEFAULT_MAX_LR['lamb']:g}, sync's, and turns --rescale-rounds' default off "
               f"(see there)",
        modes=LOCAL_MODES, elsewhere="ignored")
    outer_optimizer: str = _opt(
        "none", "local mode: update applied to the averaged weights", OUTER_OPTIMIZERS,
        modes=LOCAL_MODES)
    outer_lr: float = _opt(
        1.0, "outer learning rate (alpha of SlowMo); 1.0 with momentum 0 is plain averaging",
        modes=LOCAL_MODES)
    outer_momentum: float = _opt(0.0, "outer momentum (beta of SlowMo)", modes=LOCAL_MODES)
    rescale_rounds: bool | None = _opt(
        None, "local mode: each round stretches the mean step of each weight variable (from "
              "the last round's model) to the workers' mean length of their own steps of it, "
              "by at most sqrt(workers). A mean of steps of one length but noisy directions "
              "is shorter than they are, and LAMB and LARS set each layer's step length, so "
              "the average moves less than sync's one step would, most as the rate decays. "
              "One allreduce of a float per variable more a round. Default: on with LAMB in "
              "flat local mode (where --optimizer auto takes it, from a global batch of 1024; "
              "then LAMB's cap is sync's, see --max-lr) unless --average-optimizer-state or "
              "--round-fragments; off otherwise (SGD's mean step is the large batch's). "
              "Flat rounds of the whole model only: not with --hierarchical-sgd or "
              "--round-fragments",
        # Off where unused, so that a sweep's sync run can put it back (`refused_in`).
        modes=("local",), default_per_mode={"sync": False, "async": False}, before=False)
    round_compression: str | None = _opt(
        None, "local and async modes: how a round's state travels. none: as it is, in one "
                "allreduce (with --fp16-allreduce: as fp16 below). fp16, int8 or int4: each "
                "worker sends its change since the last round (the pseudo-gradient), plus what "
                "its last round's "
                "encoding cut off (error feedback), through an alltoall and an allgather, so "
                "every worker ends the round with the same bits. int8: one byte a value and a "
                "float32 scale per chunk of at most 1,024 values, about a quarter of float32's "
                "bytes; int4 two codes a byte and the same scales, about an eighth (as Streaming "
                "DiLoCo's 4-bit outer gradients); fp16 half. Async mode's default is none, and "
                "int8 where its period comes to one step (10 workers or more). Local mode's "
                "default is int8, except "
                "for rescaled rounds (--rescale-rounds, on by default with LAMB), which travel "
                "in int4 unless told: at global batches of 1,024 and 2,048 they ended level "
                "with int8's, at 0.126 of sync's bytes. int8 every 2 steps (--n-sync 2) ended "
                "above float32 rounds every 5 steps in 22 of 24 LeNet runs at 2 to 32 "
                "workers, at 0.13 of sync's bytes (BENCHMARKS.md)",
        # Async's default depends on the job's period: settled by `plan.settle`.
        ROUND_COMPRESSIONS, modes=LOCAL_MODES,
        default_per_mode={m: c for m, c in DEFAULT_ROUND_COMPRESSION.items() if m != "async"},
        # Rounds before it travelled as they were (fp16 with --fp16-allreduce).
        before="none")
    round_fragments: int = _opt(
        1, "local and async modes: F > 1 cuts the averaged state, in order, into F "
           "fragments of about equal bytes (Streaming DiLoCo; a dense or convolution layer "
           "may be cut between output columns, a BatchNorm layer stays whole); each round "
           "averages one fragment in turn, so a round's burst is about 1/F of the state and "
           "each fragment is averaged every F rounds, i.e. every F x --n-sync steps. Epoch ends "
           "and evaluations (unless --no-epoch-rounds), elastic commits and the run's end "
           "average every fragment, so the workers agree there; a checkpoint waits for the "
           "next round, which then averages every fragment, so it comes at most --n-sync "
           "steps after it falls due. Each fragment keeps its own "
           "--round-compression residual. Not with --outer-optimizer or --sync-seconds",
        modes=LOCAL_MODES, before=1)
    hierarchical_sgd: bool = _opt(
        False, "local and async modes: hierarchical local SGD (Lin et al. 2018) for hosts of "
               "several workers: the workers of one host average gradients every step, as sync "
               "mode does, in a Horovod process set of their own, and the hosts' models are "
               "averaged every --n-sync steps. The linear scaling rule counts a host's workers; "
               "the default period is 2 steps in local mode, as flat local SGD's, and 10/hosts in "
               "async. Rounds are cut in host shards when every host has as many workers: "
               "each worker sends its k-th of the state across hosts, a host's k workers "
               "gather the rest",
        modes=LOCAL_MODES)

    pin_cores: bool = _opt(
        False, "give each worker on a machine its own equal share of the CPU cores (all its "
               "threads, Horovod's too), as MPI's --bind-to core does: workers that share "
               "cores slow each other down", resumable=True)
    model_parallel: int = _opt(
        1, "devices each worker splits its model over: 2 puts the columns of alexnet-2col on "
           "GPUs 2*local_rank and 2*local_rank+1 (or two logical CPUs); workers stay "
           "data-parallel")

    deterministic: bool = _opt(
        False, "repeatable runs: Horovod's tensor fusion off. Which tensors share a fused "
               "allreduce depends on timing, and with 3 or more workers that changes how "
               "sums round, so two identical runs drift apart; with it off they repeat "
               "bitwise on CPU. Each gradient group (--bucket-mb) and each round's state "
               "then travels as one flat tensor. It cost 29% of LeNet's and 8% of "
               "ResNet-20's sync throughput at 4 workers on 2 cores. GPU kernels (cuDNN) are "
               "not made deterministic",
        resumable=True)  # it changes only how sums round

    # Speed.
    mixed_precision: bool = _opt(
        False, "Keras mixed_float16 policy with loss scaling (for GPUs; slow on most CPUs)")
    xla: bool = _opt(
        False, "XLA: one worker compiles the whole step; several use auto-clustering, since "
               "Horovod's allreduce has no XLA kernel (on CPU also set "
               "TF_XLA_FLAGS=--tf_xla_cpu_global_jit)")
    fp16_allreduce: bool = _opt(
        False, "send gradients through allreduce as float16 (half the bytes); local and async "
               "rounds without --round-compression go as --round-compression fp16")
    bucket_mb: str = _opt(
        DEFAULT_BUCKET_MB, "sync mode: average gradients in groups, last layers first, so early "
                           "groups travel while back-propagation goes on: auto (the model's "
                           "gradients in about 8 groups), auto:K (K groups), or a size in MB "
                           "(25; 0: one group)", resumable=True)

    # Output and fault tolerance.
    out: str | None = _opt(None, "run folder (default: runs/<time>-<model>-<mode>)",
                           resumable=True)
    validate: bool = _opt(True, "evaluate on the test split after every epoch", resumable=True)
    eval_every: int = _opt(
        0, "also evaluate every N steps within epochs, after a round that brings the workers "
           "to consensus, with a line per evaluation in metrics.jsonl (test_accuracy, "
           "examples, train_seconds, bytes_allreduced, n_sync in force): the data of time to "
           "accuracy; 0 turns it off")
    eval_examples: int | None = _opt(
        None, "--eval-every evaluates about this many examples, the same first ones of the "
              "test split every time (default: all of it)")
    checkpoint_every: str = _opt(
        "1epoch", "checkpoint interval: N steps (500, 500steps) or N epochs (2e, 2epochs); in "
                  "local mode a checkpoint waits for the next averaging round (with epoch "
                  "rounds an epoch's is at its end; with --no-epoch-rounds, up to a period "
                  "after it)",
        resumable=True)
    keep_checkpoints: int = _opt(3, "how many of the newest checkpoints to keep", resumable=True)
    resume: str = _opt(
        "auto", "auto: continue from the newest sound checkpoint in the run folder if there is "
                "one, with the run's saved options where this command gives the defaults; "
                "never: refuse a folder that holds a run; or a checkpoint folder to start from",
        resumable=True)
    elastic: bool = _opt(
        False, "elastic training: keep going when workers leave or join (run under horovodrun "
               "--min-np/--max-np --host-discovery-script); needs --out")
    elastic_commit_every: int = _opt(
        50, "elastic: steps between in-memory commits, the point a lost worker rolls back to")
    log_every: float = _opt(
        30.0, "seconds between progress lines within an epoch (step, epoch, loss, images/sec, "
              "time left), printed by rank 0 when the output is not a terminal, beside Keras's "
              "line per epoch; epochs shorter than this get none; 0 turns them off",
        resumable=True)
    divergence_guard: bool = _opt(
        True, f"stop the run, in one line that names the step, the peak rate and the global "
              f"batch and says what to try, when the training loss averaged over the workers "
              f"and the last {divergence.WINDOW} steps is not finite, or above "
              f"{divergence.EXPLODED:g} times where training started (the first step's loss, at "
              f"least ln(classes), the loss of guessing), or, after warmup, above "
              f"{divergence.FACTOR:g} times it, or was above that during warmup and "
              f"has not come back below ln(classes) less {divergence.MARGIN_SHARE:g} x "
              f"ln(classes) or, if smaller, {divergence.MARGIN_PER_CLASS:.3f} x (classes - 1) "
              f"(2.07 at 10 classes, 0.668 at 2: a network "
              f"that blew up and died), or, {divergence.STALL_EPOCHS:g} epochs after warmup and "
              f"{divergence.STALL_STEPS} steps or more into the run, "
              f"has never been below it (one that died without rising, or never started; "
              f"not judged on synthetic data, whose labels are random); checked every "
              f"{divergence.WINDOW} steps with one allreduce of 8 numbers (with "
              f"--sync-seconds at epoch ends)", resumable=True)
    step_timeout: float = _opt(
        600.0, "seconds without a finished step before a worker ends the job, naming the step "
               "(a dead or hung peer would otherwise stall it forever); 0 turns this off",
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
    `--optimizer auto` has not chosen (`hvdtrain.optimizer_choice.settled`)."""
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
    for name in ("steps_per_epoch", "train_examples", "eval_examples"):
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
        if getattr(cfg, name) not in (unused, None):
            modes = " or ".join(_field(name).metadata["modes"])
            raise ConfigError(
                f"{option_flag(name)} needs --mode {modes}, got {option_flag(name)} "
                f"{getattr(cfg, name)} with --mode {cfg.mode}")


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
