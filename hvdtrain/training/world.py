"""What depends on the number of workers: the global batch and the learning-rate schedule.

An elastic job that resizes, or a checkpoint resumed with another `-np`, gets a
new `World`; the run's progress in examples carries over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import comm
from hvdtrain.config import LOCAL_MODES, TrainConfig, rounds_compression
from hvdtrain.data import DataSource, steps_per_epoch
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import settled
from hvdtrain.periods import job_size, resolve_period
from hvdtrain.progress import TrainingProgress, epoch_length
from hvdtrain.quantize import VALUE_BYTES
from hvdtrain.schedules import ScheduleSpec, lr_scaling_workers, schedule_in_examples


# The optimizers that keep a running square of the gradient beside its momentum.
WITH_RUNNING_SQUARES = ("adam", "lamb")


@dataclass(frozen=True)
class World:
    rank: int
    workers: int
    global_batch: int
    schedule: ScheduleSpec


def current_world(cfg: TrainConfig, progress: TrainingProgress) -> World:
    """The world of the workers running now, continuing the schedule from `progress`."""
    workers = comm.size()
    # The cap's default follows the optimizer, which a run settled already (`auto`'s too).
    cfg = settled(cfg.resolved(), workers)
    epoch_examples = progress.epoch_examples
    host_workers = comm.host_group().size if cfg.hierarchical_sgd else 0
    schedule = schedule_in_examples(
        cfg.base_lr, cfg.batch_size, workers, cfg.warmup_epochs * epoch_examples,
        cfg.epochs * epoch_examples, cfg.lr_decay, progress.examples, progress.steps,
        lr_scaling_workers(workers, cfg.mode in LOCAL_MODES, cfg.local_lr_workers, host_workers),
        cfg.lr_scaling, cfg.max_lr)
    return World(comm.rank(), workers, cfg.batch_size * workers, schedule)


def costly_period_warning(cfg: TrainConfig, workers: int, hosts: int) -> str | None:
    """A line for rank 0 when local rounds would move at least as many bytes as sync mode:
    a round carries the weights and any averaged optimizer slots, sync mode the gradients
    every step, so a float32 period no longer than 1 + slots saves nothing (int8 rounds
    cost a quarter of that, but running squares travel in float32). Local mode's default,
    int8 every 2 steps, moves an eighth; async mode's (10/workers) reaches 1 step at 10
    workers. Hierarchical local SGD's replicas are the hosts: its rounds cross hosts, as
    sync's gradients would."""
    replicas = hosts if cfg.hierarchical_sgd else workers
    if cfg.mode not in LOCAL_MODES or cfg.sync_seconds is not None or replicas < 2:
        return None
    cfg = settled(cfg.resolved(), workers)  # auto's choice sets local mode's period
    period = resolve_period(cfg.n_sync, workers, hosts)
    moments = squares = 0
    if cfg.average_optimizer_state:
        squares = int(cfg.optimizer in WITH_RUNNING_SQUARES)
        moments = 1 if squares else int(cfg.momentum > 0)
    compression = rounds_compression(cfg.round_compression, cfg.fp16_allreduce)
    # Running squares travel in float32 in any round (ModelStateAverager.exact); all against
    # a sync step's gradients, which --fp16-allreduce sends as float16 too.
    round_bytes = (1 + moments) * VALUE_BYTES[compression] + squares * VALUE_BYTES["none"]
    round_cost = round_bytes / VALUE_BYTES["fp16" if cfg.fp16_allreduce else "none"]
    if not isinstance(period, int) or period > round_cost:
        return None
    return (f"hvdtrain: warning: --n-sync {cfg.n_sync} is {period} step(s) at "
            f"{job_size(workers, hosts)}, and each round moves {round_cost:g}x a sync step's "
            f"bytes: as many as --mode sync, which would keep the workers identical; use it, "
            f"or a longer period")


def epoch_examples_for(cfg: TrainConfig, data: DataSource, num_train: int | None) -> int:
    """The run's epoch length in examples (see `hvdtrain.progress.epoch_length`).

    `num_train` is None when the data has no natural epoch, or when counting it would
    mean reading every record and `--steps-per-epoch` makes the count unnecessary.
    """
    workers = comm.size()
    if num_train is not None:
        steps_per_epoch(num_train, workers, cfg.batch_size)  # a batch must fit in a shard
    examples = epoch_length(num_train, cfg.steps_per_epoch, cfg.batch_size * workers)
    total_steps = cfg.epochs * examples // (cfg.batch_size * workers)
    if cfg.mode in LOCAL_MODES and cfg.warm_start_steps >= total_steps:
        raise ConfigError(f"--warm-start-steps {cfg.warm_start_steps} leaves no local steps "
                          f"in a run of {total_steps} steps")
    return examples
