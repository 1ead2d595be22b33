"""What depends on the number of workers: the global batch and the learning-rate schedule.

An elastic job that resizes, or a checkpoint resumed with another `-np`, gets a
new `World`; the run's progress in examples carries over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import comm
from hvdtrain.config import LOCAL_MODES, TrainConfig
from hvdtrain.data import DataSource, steps_per_epoch
from hvdtrain.optimizer_choice import AUTO
from hvdtrain.plan import Job, check_length
from hvdtrain.progress import TrainingProgress, epoch_length
from hvdtrain.schedules import ScheduleSpec, lr_scaling_workers, schedule_in_examples


@dataclass(frozen=True)
class World:
    rank: int
    workers: int
    global_batch: int
    schedule: ScheduleSpec


def current_world(cfg: TrainConfig, progress: TrainingProgress) -> World:
    """The world of the workers running now, continuing the schedule from `progress`.
    `cfg` is a settled plan's config (`hvdtrain.plan.settle`): the optimizer, its cap
    and the period were chosen once, for the job as it started, and an elastic resize
    keeps them."""
    if cfg.optimizer == AUTO:
        raise ValueError("current_world takes a settled plan's config, not --optimizer auto")
    workers = comm.size()
    epoch_examples = progress.epoch_examples
    host_workers = comm.host_group().size if cfg.hierarchical_sgd else 0
    schedule = schedule_in_examples(
        cfg.base_lr, cfg.batch_size, workers, cfg.warmup_epochs * epoch_examples,
        cfg.epochs * epoch_examples, cfg.lr_decay, progress.examples, progress.steps,
        lr_scaling_workers(workers, cfg.mode in LOCAL_MODES, cfg.local_lr_workers, host_workers),
        cfg.lr_scaling, cfg.max_lr)
    return World(comm.rank(), workers, cfg.batch_size * workers, schedule)


def epoch_examples_for(cfg: TrainConfig, data: DataSource, num_train: int | None) -> int:
    """The run's epoch length in examples (see `hvdtrain.progress.epoch_length`).

    `num_train` is None when the data has no natural epoch, or when counting it would
    mean reading every record and `--steps-per-epoch` makes the count unnecessary.
    """
    workers = comm.size()
    if num_train is not None:
        steps_per_epoch(num_train, workers, cfg.batch_size)  # a batch must fit in a shard
    examples = epoch_length(num_train, cfg.steps_per_epoch, cfg.batch_size * workers)
    check_length(cfg, Job(workers, comm.host_count()), examples)  # the plan's rule
    return examples
