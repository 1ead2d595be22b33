"""One training run, in sync or local-SGD mode, on every worker of a Horovod job.

The steps, as in NVIDIA's DeepLearningExamples trainers: decide where the run
stands (`resume`), build the model and optimizer (`build`), restore or initialise
the state, make the callbacks (`callback_factory`), fit, evaluate, write the summary.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Iterator

import keras
import numpy as np

from hvdtrain import comm, files
from hvdtrain.config import TrainConfig, parse_shape
from hvdtrain.data import DataSource, load_dataset
from hvdtrain.errors import ConfigError, PeerLostError
from hvdtrain.keras.state import ModelStateAverager, reseed_dropout
from hvdtrain.machine.host_layout import sizes_from_environment
from hvdtrain.optimizer_choice import AUTO, took_lamb_notice
from hvdtrain.plan import Job, RunPlan, settle
from hvdtrain.progress import FitPhase, TrainingProgress, fit_phases
from hvdtrain.training import run_folder
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.training.build import (checkpoint_state, compiled_model, elastic_variables,
                                     save_plan, state_callback, use_world)
from hvdtrain.training.callback_factory import RunCallbacks, get_callbacks, make_checkpointer
from hvdtrain.training.evaluation import EVAL_BATCH, evaluate, first_part, naming_bad_input
from hvdtrain.training.resume import load_initial_weights, on_chief, restore_on_chief
from hvdtrain.training.saved_run import (SavedRun, kept_notice, read_saved_config,
                                         read_saved_run)
from hvdtrain.training.start import StartedWorker, start_worker
from hvdtrain.training.summary import run_summary
from hvdtrain.training.world import (World, current_world,
                                     epoch_examples_for)


@dataclass
class RunResult:
    model: keras.Model
    summary: dict[str, Any]
    history: dict[str, list[float]]
    run_dir: str
    train_shard: np.ndarray = field(repr=False)
    # What the run's state rounds handed to allreduce, built from its resolved config
    # (`hvdtrain bench` sizes and times local rounds with it).
    state_averager: ModelStateAverager = field(repr=False)


@dataclass
class Run:
    """What every stage of one run works on."""

    cfg: TrainConfig
    data: DataSource
    progress: TrainingProgress
    world: World
    model: keras.Model
    state_sync: keras.callbacks.Callback   # LocalSGD or AverageModelStatistics
    callbacks: RunCallbacks
    start_time: float
    cores_per_worker: float   # this worker's share of its machine's cores (StartedWorker)
    saves: SavePlan                        # when checkpoints and elastic commits come
    resumed_from_step: int = 0
    history: dict[str, list[float]] = field(default_factory=dict)


def train(cfg: TrainConfig, verbose: int | None = None,
          extra_callbacks: tuple[keras.callbacks.Callback, ...] = ()) -> RunResult:
    """Run `cfg` on every worker; `extra_callbacks` go after hvdtrain's own, on every rank."""
    cfg = cfg.resolved()
    started = start_worker(cfg)  # `hvdtrain train` started it already, before TensorFlow
    cfg, plan, start = _run_folder_and_saved_run(cfg, time.time())
    run_plan = _announced_plan(cfg, plan)
    cfg = run_plan.config
    data = _training_data(cfg)
    # Checkpoints, logs and the final weights are written as training goes: a full disk
    # or a folder removed meanwhile is named in one line too.
    with run_folder.naming_write_errors(cfg.out):
        run = _prepare(cfg, data, plan, started, start, extra_callbacks, run_plan)
        with naming_bad_input(data, comm.rank(), comm.size()):
            if cfg.elastic:
                _fit_elastically(run, verbose)
            else:
                with naming_a_lost_peer(run):
                    _fit(run, verbose)
            ended = time.time()  # training's end: the final evaluation is timed apart
            test_loss, test_accuracy = _final_evaluation(run)
        return _finish(run, ended - start, run.progress.trained_seconds(ended), test_loss,
                       test_accuracy)


def _final_evaluation(run: Run) -> tuple[float, float]:
    """The whole test split, under the watchdog: it ends in an allreduce, where a peer
    that hangs would block this worker for good. The watchdog is closed for good after."""
    test = run.data.test(run.world.rank, run.world.workers, EVAL_BATCH)
    watchdog = run.callbacks.watchdog
    if watchdog is None:
        return evaluate(run.model, test)
    with watchdog:  # closes it, also when the evaluation raises
        watchdog.watch("the final evaluation")
        return evaluate(run.model, test, on_batch=watchdog.beat)


@contextlib.contextmanager
def naming_a_lost_peer(run: Run) -> Iterator[None]:
    """A job without --elastic cannot go on without a peer: say so in one line, with
    what to do, rather than with TensorFlow's page of graph trace."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001  (only Horovod's failures are turned)
        if not comm.is_lost_peer(exc):
            raise
        raise PeerLostError(
            f"worker {run.world.rank} lost a peer after step {run.progress.steps}: Horovod "
            f"shut down (a worker died, or its host left the network; its log names it). Run "
            f"the same command again to resume from the newest checkpoint in {run.cfg.out}"
        ) from None


def _run_folder_and_saved_run(cfg: TrainConfig,
                              start: float) -> tuple[TrainConfig, SavedRun, float]:
    """The run folder, what the run starts from (`saved_run.read_saved_run`) and the job's
    start time, all rank 0's.

    The workers' processes start up to a second apart: timed from rank 0's start, every
    worker's step times share one origin, so a log that merges them (StepLog with timed
    rounds) stays in time order from one epoch's lines to the next.
    """
    if cfg.elastic:
        # A worker that joins later runs `train` from the top while the others are inside
        # the elastic loop, so nothing before that loop may be a collective call: each
        # worker reads what settles the plan on its own (`read_saved_config`), so each
        # settles the same plan and refuses the same options; rank 0 alone reads the
        # checkpoint, since a later worker would find the run's own folder changed.
        return cfg, read_saved_run(cfg) if comm.is_chief() else read_saved_config(cfg), start
    run_dir, start = comm.broadcast_object(
        (cfg.out or run_folder.default_run_dir(cfg.model, cfg.mode), start), name="run_dir")
    cfg = replace(cfg, out=run_dir)
    return cfg, on_chief(lambda: read_saved_run(cfg), name="saved_run"), start


def _announced_plan(cfg: TrainConfig, saved: SavedRun) -> RunPlan:
    """The run's plan (`hvdtrain.plan.settle`) for the workers running now, settled alike
    on every worker, which so all refuse what it refuses. Rank 0 says what the run kept
    from its saved run, what auto took, and the plan's lines."""
    run_plan = settle(cfg, _job(), saved)
    if comm.is_chief():
        if run_plan.kept:
            print(kept_notice(run_plan.config, run_plan.kept), flush=True)
        if cfg.optimizer == AUTO and run_plan.config.optimizer == "lamb" \
                and saved.config is None and saved.source_optimizer is None:
            print(took_lamb_notice(cfg.mode, run_plan.global_batch), flush=True)
        for line in run_plan.lines():
            print(f"hvdtrain: plan: {line}", flush=True)
    return run_plan


def _job() -> Job:
    """The job running now, as its plan counts it: each host's workers too where
    hvdtrain's horovodrun says they differ (each host scales its own rate)."""
    workers, hosts = comm.size(), comm.host_count()
    return Job(workers, hosts, _unequal_host_sizes(os.environ, workers, hosts))


def _unequal_host_sizes(env, workers: int, hosts: int) -> tuple[int, ...]:
    """Each host's workers from hvdtrain's horovodrun (`HOST_SIZES`), when they differ
    and still describe this job (an elastic job's environment is its first launch's)."""
    sizes = sizes_from_environment(env) or ()
    return sizes if len(set(sizes)) > 1 and (len(sizes), sum(sizes)) == (hosts, workers) \
        else ()


def _training_data(cfg: TrainConfig) -> DataSource:
    data = load_dataset(cfg.dataset, cfg.data_dir, parse_shape(cfg.synthetic_shape),
                        seed=cfg.seed, image_size=cfg.image_size)
    if cfg.train_examples is not None:
        data.limit_train(cfg.train_examples)
    if cfg.elastic and not data.size_is_cheap and not cfg.steps_per_epoch:
        raise ConfigError(f"--elastic with --dataset {cfg.dataset} needs --steps-per-epoch or "
                          "--train-examples (counting the records would be a collective call)")
    if not cfg.elastic:  # an elastic job's workers take new shards when they change
        data.keep_shard(comm.rank(), comm.size())
    return data


def _num_train(cfg: TrainConfig, data: DataSource) -> int | None:
    """The training set's size, unless the epoch is defined without it (see world.py)."""
    if cfg.steps_per_epoch and (data.endless or not data.size_is_cheap):
        return None
    if not data.size_is_cheap:
        # Last resort (no manifest, no --train-examples): one reader counts, all learn it.
        data.limit_train(on_chief(data.count_train, name="num_train"))
    return data.num_train


def _prepare(cfg: TrainConfig, data: DataSource, plan: SavedRun, started: StartedWorker,
             start: float, extra_callbacks, run_plan: RunPlan) -> Run:
    """Build the model and callbacks, and restore or initialise the state."""
    if plan.saved is not None:
        progress = TrainingProgress(**plan.saved.progress.saved())
    else:
        progress = TrainingProgress(epoch_examples_for(cfg, data, _num_train(cfg, data)))
    progress.start_clock(start)  # its seconds go on from the checkpoint's
    world = current_world(cfg, progress)
    model = compiled_model(cfg, data, world, started.devices)
    saves = save_plan(cfg)
    state_sync = state_callback(cfg, model, progress, saves)
    state = checkpoint_state(model, state_sync)
    checkpointer = make_checkpointer(cfg, cfg.out, state, progress, saves)
    callbacks = get_callbacks(cfg, cfg.out, start, progress, state_sync, checkpointer,
                              extra_callbacks, lambda: _eval_data(cfg, data),
                              classes=data.num_classes,
                              # Endless data is random images with random labels.
                              learnable=not data.endless)
    run = Run(cfg, data, progress, world, model, state_sync, callbacks, start,
              started.cores, saves, progress.steps)
    if plan.checkpoint:
        restore_on_chief(plan, state, cfg)
    elif cfg.init_weights and cfg.elastic:
        if comm.is_chief():  # the elastic loop's first sync broadcasts them
            load_initial_weights(model, cfg.init_weights)
    elif cfg.init_weights:
        on_chief(lambda: load_initial_weights(model, cfg.init_weights), name="init_weights")
    if comm.is_chief():
        for warning in run_plan.warnings:
            print(f"hvdtrain: warning: {warning}", flush=True)
    start_folder = partial(run_folder.start, cfg.out, cfg.save_yaml, progress.examples,
                           run_plan.to_dict())
    if not cfg.elastic:  # every worker stops, in one line, if the folder cannot be made
        on_chief(start_folder, name="run_folder")
    elif comm.is_chief():  # no collective call before the elastic loop (see above)
        start_folder()
    return run


def _eval_data(cfg: TrainConfig, data: DataSource):
    """This worker's part of what `--eval-every` evaluates, for the current workers."""
    return first_part(data.test(comm.rank(), comm.size(), EVAL_BATCH), cfg.eval_examples,
                      comm.size())


def _fit(run: Run, verbose: int | None) -> None:
    """Train from where `run.progress` stands to the last epoch, with the current workers."""
    cfg, world, progress = run.cfg, run.world, run.progress
    verbosity = verbose if verbose is not None else (
        (1 if sys.stdout.isatty() else 2) if comm.is_chief() else 0)
    # Dropout masks should differ between workers and from a run's earlier part.
    reseed_dropout(run.model, cfg.seed + world.rank + progress.steps)
    start_step = progress.examples // world.global_batch
    for phase in _phases(cfg, progress, world):
        # Where this worker's data stream starts: it took steps of its own when timed.
        first_step = start_step + progress.own_steps if cfg.sync_seconds else \
            progress.examples // world.global_batch
        with contextlib.ExitStack() as stack:
            if run.callbacks.watchdog:  # a fit that raises gets no on_train_end to disarm it
                stack.callback(run.callbacks.watchdog.close)
                # Armed before the fit: its callbacks' broadcasts at train begin wait for
                # every peer, and the first step's allowance covers them and tracing.
                run.callbacks.watchdog.expect_first_step()
            if hasattr(run.state_sync, "abandon_rounds"):  # nor one to stop its rounds
                stack.callback(run.state_sync.abandon_rounds)
            fitted = _fit_phase(run, phase, first_step, verbosity)
        for key, values in fitted.history.items():
            run.history.setdefault(key, []).extend(values)


def _phases(cfg: TrainConfig, progress: TrainingProgress, world: World) -> Iterator[FitPhase]:
    if cfg.sync_seconds:
        # Epochs end at a round, which stops the fit (LocalSGD): one fit each, open-ended.
        # A period may carry the count past more than one boundary; the next fit then
        # starts at the epoch the count has reached, so Keras's epochs follow the count.
        while progress.epoch < cfg.epochs:
            yield FitPhase(progress.epoch, progress.epoch + 1, None)
        return
    yield from fit_phases(progress.examples, progress.epoch_examples, cfg.epochs,
                          world.global_batch)


def _fit_phase(run: Run, phase: FitPhase, first_step: int, verbosity: int):
    """One `model.fit` over the epochs of `phase`, its data stream starting at `first_step`."""
    cfg, world = run.cfg, run.world
    return run.model.fit(
        run.data.train(world.rank, world.workers, cfg.batch_size, cfg.seed, first_step),
        initial_epoch=phase.first_epoch, epochs=phase.end_epoch, steps_per_epoch=phase.steps,
        validation_data=run.data.test(world.rank, world.workers, EVAL_BATCH)
        if cfg.validate else None,
        callbacks=run.callbacks.for_this_rank(), verbose=verbosity,
        shuffle=False)  # the pipeline shuffles, per worker and epoch


def _fit_elastically(run: Run, verbose: int | None) -> None:
    elastic_state = comm.ElasticState(elastic_variables(run.model, run.state_sync),
                                      progress=run.progress.saved())
    run.callbacks.add_elastic_commit(elastic_state, run.saves, run.progress)

    @comm.elastic_run
    def fit_with_current_workers(elastic_state):
        # After a reset every worker holds rank 0's last commit: continue from there.
        progress = run.progress
        progress.restore(elastic_state.progress)
        progress.consensus_step = None if run.cfg.mode == "sync" else progress.steps
        run.world = current_world(run.cfg, progress)
        use_world(run.model, run.world)
        if comm.is_chief():
            print(f"hvdtrain: training with {run.world.workers} worker(s) from step "
                  f"{progress.steps} ({progress.examples} examples)", flush=True)
        _fit(run, verbose)

    fit_with_current_workers(elastic_state)


def _finish(run: Run, wall_seconds: float, train_seconds: float, test_loss: float,
            test_accuracy: float) -> RunResult:
    cfg, world = run.cfg, run.world
    summary = run_summary(cfg, world, run.model, run.progress,
                          run.callbacks.throughput.images_per_sec, run.history,
                          run.resumed_from_step, (wall_seconds, train_seconds), test_loss,
                          test_accuracy, run.cores_per_worker)
    if comm.is_chief():
        files.atomic_write(os.path.join(cfg.out, run_folder.FINAL_WEIGHTS), run.model.save_weights)
        files.write_json(os.path.join(cfg.out, run_folder.SUMMARY), summary)
        print(f"hvdtrain: test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) | "
              f"{summary['images_per_sec']:.0f} images/sec on {world.workers} worker(s) | "
              f"{wall_seconds:.1f} s | run folder: {cfg.out}", flush=True)
    return RunResult(run.model, summary, run.history, cfg.out,
                     run.data.shard(world.rank, world.workers), run.state_sync.averager)
