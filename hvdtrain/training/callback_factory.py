"""The callbacks of one run, made once and listed in the order that makes them correct.

Order, for every `fit` of the run:
  1. `CountProgress`: the progress every later callback reads;
  2. the state callbacks: the initial broadcast (sync mode) and `LocalSGD` or
     `AverageModelStatistics`, so later ones see the consensus model; then the
     evaluations within epochs (`--eval-every`), which ask it for consensus first;
  3. throughput, then `MetricAverage` (which averages what came before it), the
     finite-loss guard, the divergence guard (before anything logs or saves what a
     diverged step left) and the step log, then the user's extra callbacks;
  4. rank 0 only: progress lines within an epoch, the metrics log, TensorBoard and
     checkpoints, which read averaged metrics and the consensus weights;
  5. the elastic commit, which may end the `fit` and so comes after the epoch's logs;
  6. the step watchdog, last, so a checkpoint save counts as progress.
Rank 0 can change in an elastic job, so the list is drawn up again for every `fit`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.config import LOCAL_MODES, TrainConfig
from hvdtrain.keras.callbacks import BroadcastInitialState, MetricAverage
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.training import run_folder
from hvdtrain.training.callbacks import (Checkpointer, CountProgress, ElasticCommit,
                                         FiniteLossGuard, MetricsLog, StepLog, ThroughputMeter)
from hvdtrain.training.checkpoints import CheckpointStore
from hvdtrain.training.divergence_guard import DivergenceGuard
from hvdtrain.training.periodic_eval import PeriodicEvaluation
from hvdtrain.training.progress_log import ProgressLog
from hvdtrain.training.watchdog import StepWatchdog


@dataclass
class RunCallbacks:
    """Every callback of the run; the ones with state live as long as the run."""

    every_rank: list[keras.callbacks.Callback]
    chief_only: list[keras.callbacks.Callback]
    throughput: ThroughputMeter
    step_log: StepLog
    watchdog: StepWatchdog | None
    elastic: list[keras.callbacks.Callback] = field(default_factory=list)

    def add_elastic_commit(self, elastic_state, saves: SavePlan,
                           progress: TrainingProgress) -> None:
        self.elastic = [ElasticCommit(elastic_state, saves, progress, step_log=self.step_log)]

    def for_this_rank(self) -> list[keras.callbacks.Callback]:
        chief = self.chief_only if comm.is_chief() else []
        return self.every_rank + chief + self.elastic + ([self.watchdog] if self.watchdog else [])


def get_callbacks(cfg: TrainConfig, run_dir: str, start_time: float, progress: TrainingProgress,
                  state_sync: keras.callbacks.Callback, checkpointer: Checkpointer,
                  extra: tuple[keras.callbacks.Callback, ...] = (),
                  test_data: Callable[[], tf.data.Dataset] | None = None,
                  classes: int = 0, learnable: bool = True) -> RunCallbacks:
    """`test_data`: this worker's part of the test split, for `--eval-every`; `classes`:
    the model's, for the divergence guard's reference (0: unknown); `learnable`: False
    for data whose labels are random, which the guard must not expect to be learnt."""
    throughput = ThroughputMeter(progress)
    one_worker_warm_start = cfg.mode in LOCAL_MODES and cfg.warm_start == "single"
    step_log = StepLog(os.path.join(run_dir, run_folder.STEPS), start_time, progress,
                       chief_only_steps=cfg.warm_start_steps if one_worker_warm_start else 0,
                       per_worker=cfg.sync_seconds is not None)
    broadcast = [BroadcastInitialState(progress=progress)] if cfg.mode == "sync" else []
    watchdog = StepWatchdog(cfg.step_timeout) if cfg.step_timeout else None
    evaluation = PeriodicEvaluation(cfg.eval_every if test_data else 0, test_data, state_sync,
                                    progress, start_time,
                                    os.path.join(run_dir, run_folder.METRICS),
                                    cfg.fp16_allreduce, beat=watchdog.beat if watchdog else None)
    divergence = [DivergenceGuard(progress, cfg.batch_size, cfg.warmup_epochs, classes,
                                  at_epoch_ends=cfg.sync_seconds is not None,
                                  judge_learning=learnable)
                  ] if cfg.divergence_guard else []
    every_rank = [CountProgress(progress, cfg.batch_size), *broadcast, state_sync, evaluation,
                  throughput,
                  MetricAverage(), FiniteLossGuard(progress, checkpointer.store), *divergence,
                  step_log, *extra]
    progress_log = [ProgressLog(progress, cfg.epochs, cfg.log_every)] if cfg.log_every else []
    chief_only = [
        *progress_log,
        MetricsLog(os.path.join(run_dir, run_folder.METRICS), start_time, progress),
        keras.callbacks.TensorBoard(os.path.join(run_dir, run_folder.TENSORBOARD),
                                    write_graph=False, profile_batch=0),
        checkpointer,
    ]
    return RunCallbacks(every_rank, chief_only, throughput, step_log, watchdog)


def make_checkpointer(cfg: TrainConfig, run_dir: str, state, progress: TrainingProgress,
                      saves: SavePlan) -> Checkpointer:
    store = CheckpointStore(os.path.join(run_dir, run_folder.CHECKPOINTS), cfg.keep_checkpoints)
    return Checkpointer(store, state, saves, progress, cfg.batch_size)
