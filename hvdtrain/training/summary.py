"""summary.json: what a finished run did, in numbers."""

from __future__ import annotations

import math
from typing import Any

import keras

from hvdtrain import comm
from hvdtrain.config import LOCAL_MODES, TrainConfig, n_sync_period
from hvdtrain.keras.host_shards import HostShards
from hvdtrain.keras.state import variable_bytes
from hvdtrain.rounds.periods import PerWorkerPeriod
from hvdtrain.progress import TrainingProgress
from hvdtrain.training.world import World


def round_schedule(cfg: TrainConfig, workers: int, hosts: int) -> dict[str, float | str]:
    """When the workers' state was averaged: every `n_sync` steps (1 in sync mode, whose
    gradients are averaged every step) or every `sync_seconds` of wall time. A timed run
    has no step period, so it records no `n_sync`. A period given as N/workers (or N/hosts)
    records the steps it came to for `workers` on `hosts`, and the rule as `n_sync_rule`."""
    if cfg.mode not in LOCAL_MODES:
        return {"n_sync": 1}
    if cfg.sync_seconds is not None:
        return {"sync_seconds": cfg.sync_seconds}
    period = n_sync_period(cfg)
    if isinstance(period, PerWorkerPeriod):
        return {"n_sync": period.steps(workers, hosts),
                "n_sync_rule": cfg.n_sync}
    return {"n_sync": cfg.n_sync}


def topology(cfg: TrainConfig, model: keras.Model, progress: TrainingProgress) -> dict[str, Any]:
    """Hierarchical local SGD's groups (how many hosts, and this worker's host's workers,
    which average gradients every step), and what this worker handed to collectives among
    its host's workers apart from those among all (the rounds, which cross hosts)."""
    if not cfg.hierarchical_sgd:
        return {}
    group = comm.host_group()
    within = allreduced_bytes(model, progress, cfg.fp16_allreduce) - progress.state_bytes
    # Rounds are cut in host shards when the hosts are of one size (hvdtrain.keras.host_shards):
    # a worker's rounds then carry its shard across hosts, and the gather of the others'
    # inside its host is not counted.
    shards = HostShards.count()
    return {"hierarchical": True, "hosts": group.hosts, "workers_per_host": group.size,
            "host_shards": shards, "host_groups_at_start": comm.host_groups_at_start(),
            "bytes_allreduced_within_host": within,
            "bytes_allreduced_across_hosts": progress.state_bytes}


def allreduced_bytes(model: keras.Model, progress: TrainingProgress, fp16: bool) -> int:
    """What this worker has handed to allreduce so far: gradients on averaged steps, model
    state in averaging rounds (none in rounds held with one worker)."""
    gradient_steps = int(model.optimizer.averaged_steps.numpy())
    return gradient_steps * variable_bytes(model.trainable_variables, fp16) + progress.state_bytes


def run_summary(cfg: TrainConfig, world: World, model: keras.Model, progress: TrainingProgress,
                images_per_sec: float, history: dict[str, list[float]], resumed_from_step: int,
                seconds: tuple[float, float], test_loss: float, test_accuracy: float,
                cores_per_worker: float) -> dict[str, Any]:
    """The summary of a run, from this worker's counts; `seconds`: this process's wall
    time to the end of training, and the run's training seconds then."""
    wall_seconds, train_seconds = seconds
    gradient_steps = int(model.optimizer.averaged_steps.numpy())
    return {
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        # The job's rate, which the workers agreed on at every epoch end (ThroughputMeter).
        "images_per_sec": images_per_sec,
        # This process's wall time from its start to training's end (a resumed run's
        # counts from its resume), the final evaluation left out.
        "wall_seconds": wall_seconds,
        # The run's, every process's: training, and evaluating within it (Keras's after
        # each epoch, --eval-every's within them). A run that never stopped took their sum
        # as its wall time.
        "train_seconds": train_seconds,
        "eval_seconds": progress.eval_seconds,
        "workers": world.workers,
        "mode": cfg.mode,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "epochs": cfg.epochs,
        "epoch_examples": progress.epoch_examples,
        "examples_trained": progress.examples,
        "steps_per_epoch": math.ceil(progress.epoch_examples / world.global_batch),
        "total_steps": progress.steps,
        # In this process; they differ between workers when rounds come every T seconds.
        "steps_per_worker": progress.steps_by_worker(world.workers),
        "steps_run": progress.steps - resumed_from_step,
        "resumed_from_step": resumed_from_step,
        "global_batch": world.global_batch,
        "peak_lr": world.schedule.peak_lr,
        "parameters": int(model.count_params()),
        "model_parallel": cfg.model_parallel,
        # Rank 0's share of the cores: its own with --pin-cores; else the cores it may
        # use over the workers of its machine that share them (0.062 at 32 on 2 cores).
        "cores_per_worker": cores_per_worker,
        **round_schedule(cfg, world.workers, comm.host_group().hosts),
        **topology(cfg, model, progress),
        # Local SGD's state-averaging rounds; steps whose gradients were allreduced.
        "averaging_rounds": progress.averaging_rounds,
        "gradient_steps_averaged": gradient_steps,
        # Seconds rank 0's training thread spent in averaging rounds, in this process.
        "round_seconds": progress.round_seconds,
        # What this worker handed to allreduce: gradients on averaged steps, model state
        # in averaging rounds (none in rounds held with one worker).
        "bytes_allreduced": allreduced_bytes(model, progress, cfg.fp16_allreduce),
        # Rank 0's whole state, broadcast when a set of workers starts (not per fit).
        "bytes_broadcast": progress.broadcast_bytes,
        "final_train_loss": float(history["loss"][-1]) if history else float("nan"),
        "final_train_accuracy": float(history["accuracy"][-1]) if history else float("nan"),
    }
