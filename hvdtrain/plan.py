"""A run's settled plan: what a job will do, decided once, before any worker starts.

`settle(cfg, job, saved)` takes the options (a validated `TrainConfig`), the job's shape
(workers, hosts) and what the run starts from (`training.saved_run.read_saved_run`: the
saved run it continues, or the run whose checkpoint it starts from), and returns a
frozen `RunPlan`: the optimizer and why, the peak learning rate (each host's, where
hierarchical hosts differ in size), its cap and warmup, the period for this job, the
form of the rounds, the bytes a worker sends per step, the defaults that came from the
saved run, and the warnings. It is the one place a run's choices are made: the runner
trains by it and writes it beside `config.yaml`, `hvdtrain plan` prints it without
starting anything, `hvdtrain bench` and `hvdtrain sweep` ask it what each job would do.

Pure Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from hvdtrain.config import (ASYNC_ONE_STEP_COMPRESSION, STATISTICS_SHARE, TrainConfig,
                             round_spec)
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import AUTO, LAMB_FROM_GLOBAL_BATCH, auto_optimizer
from hvdtrain.progress import run_steps
from hvdtrain.rounds.periods import LOCAL_MODES, LinkPeriod, job_size, parse_period, resolve_period
from hvdtrain.rounds.payload import VALUE_BYTES, WHOLE_STATISTICS, payload_bytes
from hvdtrain.schedules import lr_scaling_workers, scaled_lr
from hvdtrain.training.saved_run import SavedRun, kept_options

# A model's size stands in as this many values where the byte shares are worked out: the
# shares hardly depend on it (scales and padding are under 1% from a few thousand values).
NOMINAL_VALUES = 1_000_000
# The largest global batch any of hvdtrain's recipes has been trained at (LeNet-5, 32 x 64;
# BENCHMARKS.md, "Not measured"): past it the learning rate's rule and auto's choice are
# extrapolated, so the plan says so.
LARGEST_MEASURED_GLOBAL_BATCH = 2048
# Optimizers that keep a running square beside the momentum (it travels in float32).
WITH_RUNNING_SQUARES = ("adam", "lamb")


@dataclass(frozen=True)
class Job:
    """The shape of the job a plan is for: its workers, on how many hosts, and where the
    hosts differ in size, each host's workers in the hosts' order (() for hosts of one
    size, `workers // hosts` each)."""
    workers: int
    hosts: int = 1
    host_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    config: TrainConfig            # the options as the run trains by them
    job: Job
    optimizer_reason: str
    peak_lr: float
    initial_lr: float
    lr_workers: int                # the workers the scaling rule counts
    period: int | str | None       # steps for this job, the adaptive rule, or None
    round_form: str                # how a round travels, in words ("" in sync mode)
    send_share: float | None       # bytes a worker sends a step, as a share of sync's
    kept: Mapping[str, Any] = field(default_factory=dict)  # from the saved run
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()    # what was measured of such a job, where it matters
    # (workers, peak rate) of each host, where hierarchical hosts differ in size: each
    # scales the rate for its own workers; `peak_lr` is then the first host's (rank 0's).
    host_peak_lrs: tuple[tuple[int, float], ...] = ()

    @property
    def global_batch(self) -> int:
        return self.config.batch_size * self.job.workers

    def lines(self) -> list[str]:
        """The plan in a few readable lines (what `hvdtrain plan` and rank 0 print)."""
        cfg = self.config
        lines = [f"{cfg.mode} mode, {job_size(self.job.workers, self.job.hosts)}, "
                 f"global batch {self.global_batch} ({self.job.workers} x {cfg.batch_size})",
                 f"optimizer {cfg.optimizer}: {self.optimizer_reason}",
                 f"learning rate: peak {self.peak_lr:.4g} ({cfg.lr_scaling} rule on "
                 f"{self.lr_workers} workers' batch, base {cfg.base_lr:g}, "
                 f"{_cap_words(cfg.max_lr)}), warmup {cfg.warmup_epochs:g} epochs from "
                 f"{self.initial_lr:.4g}, then {cfg.lr_decay}"]
        if self.host_peak_lrs:
            peaks = ", ".join(f"{peak:.4g} on a host of {size}" for size, peak in
                              self.host_peak_lrs)
            lines.append(f"hosts differ in size, and each scales its own rate: peak {peaks}")
        if cfg.mode in LOCAL_MODES:
            lines.append(f"rounds: {self.round_form}")
        if self.send_share is not None:
            across = " across hosts" if cfg.hierarchical_sgd else ""
            lines.append(f"bytes a worker sends{across} per step: {self.send_share:.3g} of "
                         f"sync mode's")
        if self.kept:
            kept = ", ".join(f"{name}={value!r}" for name, value in self.kept.items())
            lines.append(f"kept from the saved run: {kept}")
        return lines + [f"note: {note}" for note in self.notes]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON values (`plan.json` in the run folder, `hvdtrain plan --json`)."""
        return {"mode": self.config.mode, "workers": self.job.workers, "hosts": self.job.hosts,
                "global_batch": self.global_batch, "optimizer": self.config.optimizer,
                "optimizer_reason": self.optimizer_reason, "peak_lr": self.peak_lr,
                "initial_lr": self.initial_lr, "max_lr": self.config.max_lr,
                "host_sizes": list(self.job.host_sizes),
                "host_peak_lrs": [list(pair) for pair in self.host_peak_lrs],
                "lr_scaling": self.config.lr_scaling, "lr_workers": self.lr_workers,
                "warmup_epochs": self.config.warmup_epochs, "period": self.period,
                "round_compression": _compression(self.config),
                "round_fragments": self.config.round_fragments,
                "rescale_rounds": bool(self.config.rescale_rounds),
                "round_form": self.round_form, "send_share": self.send_share,
                "kept": dict(self.kept), "warnings": list(self.warnings),
                "notes": list(self.notes)}


def settle(cfg: TrainConfig, job: Job, saved: SavedRun | None = None,
           epoch_examples: int | None = None) -> RunPlan:
    """The plan of `cfg` for `job`, starting from `saved` (None: a new run), in order:

    1. the saved run: the options it keeps over this command's defaults, and those it
       refuses to change (`saved_run.kept_options`);
    2. the optimizer: as given, else the one the saved run or the run whose checkpoint
       it starts from took (a given one that differs is refused), else auto's choice;
    3. the learning rate for this job's size (each host's, where hierarchical hosts
       differ in size); 4. the period; 5. how a round travels and what it sends;
    6. what this job's size refuses: with `epoch_examples` (the run's epoch, when the
       caller knows it), a warm start as long as the run.
    """
    resumed, kept = _saved_choices(cfg, job, saved or SavedRun())
    cfg = dataclasses.replace(cfg, **kept).resolved()
    optimizer, reason = _optimizer(cfg, job, resumed)
    cfg = dataclasses.replace(cfg, optimizer=optimizer).resolved()
    host_peaks = _host_peaks(cfg, job)
    lr_workers = _lr_workers(cfg, job, job.workers // job.hosts)
    period = _period(cfg, job)
    cfg = _async_compression(cfg, period)
    if epoch_examples is not None:
        check_length(cfg, job, epoch_examples)
    return RunPlan(
        config=cfg, job=job, optimizer_reason=reason,
        peak_lr=host_peaks[0][1] if host_peaks else _peak(cfg, lr_workers),
        initial_lr=scaled_lr(cfg.base_lr, cfg.batch_size, cfg.lr_scaling, cfg.max_lr),
        lr_workers=lr_workers, period=period, round_form=_round_form(cfg, period),
        send_share=_send_share(cfg, job, period), kept=dict(kept), host_peak_lrs=host_peaks,
        warnings=tuple(w for w in (costly_period(cfg, job), unmeasured_batch(cfg, job),
                                   stretched_rescaled_rounds(cfg)) if w),
        notes=tuple(n for n in (_one_host(cfg, job),) if n))


def _saved_choices(cfg: TrainConfig, job: Job,
                   saved: SavedRun) -> tuple[str | None, dict[str, Any]]:
    """(the optimizer the run continues with, the saved options it keeps)."""
    if saved.config is not None:
        # A config.yaml saved before `auto` chose takes auto's choice for this job.
        before = _with_optimizer(saved.config, job, None)
        now = _with_optimizer(cfg, job, before.optimizer)
        return before.optimizer, kept_options(cfg, now, before, job.workers, job.hosts)
    taken = saved.source_optimizer
    if taken is not None and cfg.optimizer not in (AUTO, taken):
        raise ConfigError(f"--resume {cfg.resume}: the checkpoint was written with "
                          f"--optimizer {taken} ({saved.source}), not {cfg.optimizer}: give "
                          f"--optimizer {taken} or auto")
    return taken, {}


def _with_optimizer(cfg: TrainConfig, job: Job, resumed: str | None) -> TrainConfig:
    """`cfg` with `--optimizer auto` made concrete, its defaults with it."""
    return dataclasses.replace(cfg, optimizer=_optimizer(cfg, job, resumed)[0]).resolved()


def _lr_workers(cfg: TrainConfig, job: Job, host_workers: int) -> int:
    """The workers whose batch the scaling rule counts, on a host of `host_workers`."""
    return lr_scaling_workers(job.workers, cfg.mode in LOCAL_MODES, cfg.local_lr_workers or 0,
                              host_workers if cfg.hierarchical_sgd else 0)


def _peak(cfg: TrainConfig, lr_workers: int) -> float:
    return scaled_lr(cfg.base_lr, cfg.batch_size * lr_workers, cfg.lr_scaling, cfg.max_lr)


def _host_peaks(cfg: TrainConfig, job: Job) -> tuple[tuple[int, float], ...]:
    """(workers, peak rate) of each host of a hierarchical job whose hosts differ in size,
    in the hosts' order: each host scales the rate for its own workers (`world.py`);
    () when every host trains at one rate."""
    if not cfg.hierarchical_sgd or len(set(job.host_sizes)) < 2:
        return ()
    return tuple((size, _peak(cfg, _lr_workers(cfg, job, size))) for size in job.host_sizes)


def check_length(cfg: TrainConfig, job: Job, epoch_examples: int) -> None:
    """Refuse what a new run's length at this job's size leaves no room for (the runner
    asks once it has counted the epoch; `settle` when its caller knows it)."""
    steps = run_steps(epoch_examples, cfg.epochs, cfg.batch_size * job.workers)
    if cfg.mode in LOCAL_MODES and cfg.warm_start_steps >= steps:
        raise ConfigError(f"--warm-start-steps {cfg.warm_start_steps} leaves no local steps "
                          f"in a run of {steps} steps at {job_size(job.workers, job.hosts)}")


def _optimizer(cfg: TrainConfig, job: Job, resumed: str | None) -> tuple[str, str]:
    """The optimizer the run takes, and why, in words."""
    if cfg.optimizer != AUTO:
        return cfg.optimizer, "given"
    if resumed is not None:
        return resumed, "--optimizer auto keeps what the saved run took"
    batch = cfg.batch_size * job.workers
    chosen = auto_optimizer(cfg.mode, batch, cfg.elastic, cfg.nesterov, cfg.hierarchical_sgd)
    if chosen == "lamb":
        return chosen, (f"--optimizer auto takes LAMB from a global batch of "
                        f"{LAMB_FROM_GLOBAL_BATCH} in {cfg.mode} mode (this job's: {batch}); "
                        f"measured with LeNet-5 and ResNet-20 only, --optimizer sgd keeps SGD")
    why = _why_sgd(cfg, batch)
    return chosen, f"--optimizer auto takes SGD {why}"


def _why_sgd(cfg: TrainConfig, batch: int) -> str:
    if cfg.elastic:
        return "in an elastic job, whose global batch changes"
    if cfg.nesterov:
        return "with --nesterov"
    if cfg.mode == "async":
        return "in async mode (LAMB is not measured there)"
    if cfg.hierarchical_sgd:
        return "in hierarchical local SGD (LAMB is not measured there)"
    return f"below a global batch of {LAMB_FROM_GLOBAL_BATCH} (this job's: {batch})"


def _period(cfg: TrainConfig, job: Job) -> int | str | None:
    """Steps between rounds for this job, the adaptive rule as given, or None."""
    if cfg.mode not in LOCAL_MODES or cfg.sync_seconds is not None:
        return None
    period = resolve_period(cfg.n_sync, job.workers, job.hosts)
    return period if isinstance(period, int) else str(cfg.n_sync)


def _async_compression(cfg: TrainConfig, period: int | str | None) -> TrainConfig:
    """Async mode's rounds, unless given: float32 (`none`), or where its period comes to one
    step `ASYNC_ONE_STEP_COMPRESSION`, since float32 rounds every step move sync's bytes.
    With --fp16-allreduce they stay `none`, which that flag sends as fp16."""
    if cfg.mode != "async" or cfg.round_compression is not None:
        return cfg
    one_step = period == 1 and not cfg.fp16_allreduce
    return dataclasses.replace(cfg, round_compression=ASYNC_ONE_STEP_COMPRESSION
                               if one_step else "none")


def _compression(cfg: TrainConfig) -> str:
    if cfg.mode not in LOCAL_MODES:
        return "none"
    return round_spec(cfg).compression


_VALUE_WORDS = {"none": "float32", "topk": "the top 8 of every 256",
                "int2": "ternary int2", "int1": "sign (int1)"}


def _round_form(cfg: TrainConfig, period: int | str | None) -> str:
    """How a round is held and what it moves, in words."""
    if cfg.mode not in LOCAL_MODES:
        return ""
    when = (f"every {cfg.sync_seconds:g} s" if cfg.sync_seconds is not None
            else "every step" if period == 1
            else f"every {period} steps" if isinstance(period, int)
            else _rule_words(period))
    if cfg.hierarchical_sgd:
        when += " across hosts (gradients averaged every step inside each host)"
    if cfg.mode == "async":
        when += (", each behind the next steps" if cfg.merge_after is None else
                 f", each behind the next steps, merged {cfg.merge_after} step"
                 f"{'s' * (cfg.merge_after != 1)} after it starts")
    what = ["weights"] + (["BatchNorm statistics"] if cfg.average_bn_stats else []) + \
        (["optimizer state"] if cfg.average_optimizer_state else [])
    # "none" is the option's word for rounds that compress nothing: they send float32.
    compression = _compression(cfg)
    form = [f"{_VALUE_WORDS.get(compression, compression)} values"]
    if compression in WHOLE_STATISTICS and _statistics(cfg):
        form.append("statistics in float32")
    if cfg.round_fragments > 1:
        form.append(f"one of {cfg.round_fragments} fragments a round")
    if cfg.rescale_rounds:
        form.append("rescaled to the workers' step lengths")
    if cfg.outer_optimizer != "none":
        form.append(f"{cfg.outer_optimizer} outer step")
    momentum = "averaged" if cfg.average_optimizer_state else "kept on each worker"
    return (f"{when}; averaging {', '.join(what)} ({', '.join(form)}); optimizer state "
            f"{momentum}")


def _rule_words(period: str) -> str:
    """A period that a rule sets at rounds, in words."""
    rule = parse_period(period)
    if isinstance(rule, LinkPeriod):
        return (f"as the link allows ({period}: every 1 to {rule.maximum} steps, the fewest "
                f"that hold rounds to {rule.share_percent}% of a worker's time, set at every "
                f"round from the workers' timings)")
    return f"by the rule {period}"


def _replicas(cfg: TrainConfig, job: Job) -> int:
    """The models a round averages: the hosts' in the hierarchy, else the workers'."""
    return job.hosts if cfg.hierarchical_sgd else job.workers


def _sync_step_share(cfg: TrainConfig) -> float:
    """A sync step's gradients as a share of float32's (--fp16-allreduce halves them)."""
    return VALUE_BYTES["fp16" if cfg.fp16_allreduce else "none"] / VALUE_BYTES["none"]


def _send_share(cfg: TrainConfig, job: Job, period: int | str | None) -> float | None:
    """Bytes a worker hands to the network per step (across hosts, for the hierarchy), as
    a share of a sync step's float32 gradients; None where the period is not fixed."""
    replicas = _replicas(cfg, job)
    if cfg.mode not in LOCAL_MODES:
        return _sync_step_share(cfg)
    if not isinstance(period, int) or replicas < 2:
        return None if replicas >= 2 else 0.0
    # A host's workers split its round across hosts in shards (`keras.host_shards`).
    shards = job.workers // job.hosts if cfg.hierarchical_sgd else 1
    return _round_share(cfg, replicas) / period / cfg.round_fragments / shards


def _round_share(cfg: TrainConfig, replicas: int) -> float:
    """A whole round's bytes, as a share of one copy of the weights in float32."""
    values = NOMINAL_VALUES
    compression = _compression(cfg)
    coded = payload_bytes(values, replicas, compression)
    moments = squares = 0
    if cfg.average_optimizer_state:
        squares = int(cfg.optimizer in WITH_RUNNING_SQUARES)
        moments = 1 if squares else int(cfg.momentum > 0)
    # Running squares travel in float32 in any round (`ModelStateAverager.exact`), and so
    # do BatchNorm's statistics in the coarse rounds; in the others they are coded with the
    # weights.
    float32_copies, coded_copies = squares, 1 + moments
    if compression in WHOLE_STATISTICS:
        float32_copies += _statistics(cfg)
    else:
        coded_copies += _statistics(cfg)
    total = coded_copies * coded + float32_copies * VALUE_BYTES["none"] * values
    return total / (VALUE_BYTES["none"] * values)


def _statistics(cfg: TrainConfig) -> float:
    """The BatchNorm statistics a round averages, as a share of the model's weights (0 for a
    model without BatchNorm, or with --no-average-bn-stats)."""
    return STATISTICS_SHARE.get(cfg.model, 0.0) if cfg.average_bn_stats else 0.0


def _one_host(cfg: TrainConfig, job: Job) -> str | None:
    """Flat local rounds on one host cross no network, yet each is encoded and decoded:
    over this project's loopback, local's default ran below sync's images/sec
    (BENCHMARKS.md, "Local mode on a fast link")."""
    if cfg.mode not in LOCAL_MODES or cfg.hierarchical_sgd or job.hosts > 1 \
            or job.workers < 2:
        return None
    measured = ("over a loopback local mode's default ran at 0.87 to 0.98x sync's images/sec "
                "at 2 workers (BENCHMARKS.md, \"Local mode on a fast link\"); "
                if cfg.mode == "local" else "")
    return (f"on one host the rounds cross no network: {measured}sync suits one host (give "
            f"--hosts for a job across hosts)")


def costly_period(cfg: TrainConfig, job: Job) -> str | None:
    """Local rounds that move at least as many bytes as sync mode would save nothing
    (`cfg` settled: its period known)."""
    period = _period(cfg, job)
    replicas = _replicas(cfg, job)
    if cfg.mode not in LOCAL_MODES or not isinstance(period, int) or replicas < 2:
        return None
    round_cost = _round_share(cfg, replicas) / _sync_step_share(cfg)
    if period > round_cost:
        return None
    return (f"--n-sync {cfg.n_sync} is {period} step(s) at {job_size(job.workers, job.hosts)}, "
            f"and each round moves {round_cost:.3g}x a sync step's bytes: as many as --mode "
            f"sync, which would keep the workers identical; use it, or a longer period")


def unmeasured_batch(cfg: TrainConfig, job: Job) -> str | None:
    """A global batch past any that hvdtrain's recipes were trained at."""
    batch = cfg.batch_size * job.workers
    if batch <= LARGEST_MEASURED_GLOBAL_BATCH:
        return None
    return (f"a global batch of {batch} ({job.workers} x {cfg.batch_size}) is past the largest "
            f"hvdtrain has trained at, {LARGEST_MEASURED_GLOBAL_BATCH}: its optimizer choice "
            f"and learning rate are extrapolated there; compare with a run at "
            f"{LARGEST_MEASURED_GLOBAL_BATCH} or less before trusting the result")


def stretched_rescaled_rounds(cfg: TrainConfig) -> str | None:
    """--n-sync link on rescaled rounds (flat local mode's default on LAMB, every step):
    the rule may stretch them to M steps, and rescaled rounds every 2 steps ended
    1.97 +- 1.68 points below sync at 32 x 64 (LeNet-5, 5 epochs, 3 seeds) where every
    step ended level (BENCHMARKS.md, "Local mode at 16 and 32 workers")."""
    period = parse_period(cfg.n_sync) if cfg.n_sync is not None else None
    if cfg.mode != "local" or not cfg.rescale_rounds or not isinstance(period, LinkPeriod) \
            or period.maximum < 2:
        return None
    return (f"--n-sync {cfg.n_sync} stretches rescaled rounds from every step to up to "
            f"{period.maximum} steps: rescaled rounds every 2 steps ended 1.97 +- 1.68 points "
            f"below sync at 32 x 64 (LeNet-5, 3 seeds), where every step, the default on "
            f"LAMB, ended level; link is not measured for time to accuracy")


def _cap_words(max_lr: float) -> str:
    return f"capped at {max_lr:g}" if max_lr else "no cap"
