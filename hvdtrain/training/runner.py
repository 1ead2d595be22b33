"""One training run, in sync or local-SGD mode, on every worker of a Horovod job."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.averaging import bytes_allreduced
from hvdtrain.config import TrainConfig, load_config, parse_interval, parse_shape
from hvdtrain.data import DataSource, load_dataset, steps_per_epoch
from hvdtrain.devices import configure_devices
from hvdtrain.errors import ConfigError, DataError, HvdtrainError
from hvdtrain.keras.callbacks import AverageModelStatistics, BroadcastInitialState, MetricAverage
from hvdtrain.keras.local_sgd import LocalSGD
from hvdtrain.keras.schedule import WarmupDecaySchedule
from hvdtrain.keras.state import build_optimizer, reseed_dropout, variable_bytes
from hvdtrain.models import build_model
from hvdtrain.schedules import ScheduleSpec, warmup_steps_for
from hvdtrain import files
from hvdtrain.training import run_folder
from hvdtrain.training.callbacks import (Checkpointer, ElasticCommit, FiniteLossGuard, MetricsLog,
                                        StepLog, ThroughputMeter)
from hvdtrain.training.watchdog import StepWatchdog
from hvdtrain.training.checkpoints import CheckpointStore, Progress, fit_phases, restore
from hvdtrain.training.optimizers import make_optimizer

EVAL_BATCH = 250


@dataclass
class RunResult:
    model: keras.Model
    summary: dict[str, Any]
    history: dict[str, list[float]]
    run_dir: str
    train_shard: np.ndarray = field(repr=False)


def _on_chief(compute: Callable[[], Any], name: str) -> Any:
    """`compute()` on rank 0, its result on every rank; its HvdtrainError raised on every
    rank as a ConfigError, so all workers exit together instead of waiting for rank 0."""
    value, problem = None, None
    if comm.is_chief():
        try:
            value = compute()
        except HvdtrainError as exc:
            problem = str(exc)
    value, problem = comm.broadcast_object((value, problem), name=name)
    if problem:
        raise ConfigError(problem)
    return value


def _load_initial_weights(model: keras.Model, path: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"--init-weights file not found: {path}")
    try:
        model.load_weights(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--init-weights {path} does not fit model {model.name}: "
                          f"{str(exc).splitlines()[0]}") from None


# Options that may differ between a run and its resumption.
RESUMABLE_CHANGES = {"out", "resume", "step_timeout", "validate", "keep_checkpoints", "data_dir",
                     "checkpoint_every", "init_weights"}


@dataclass
class ResumePlan:
    checkpoint: str | None = None
    progress: Progress | None = None
    notes: list[str] = field(default_factory=list)


def _plan_resume(cfg: TrainConfig) -> ResumePlan:
    """Rank 0: start fresh, or continue from which checkpoint? Raises what stops the run."""
    store = CheckpointStore(os.path.join(cfg.out, run_folder.CHECKPOINTS))
    if cfg.resume not in ("auto", "never"):
        progress, problem = store.verify(cfg.resume)
        if problem:
            raise ConfigError(f"--resume {problem}")
        return ResumePlan(cfg.resume, progress)
    problem = run_folder.existing_run_problem(cfg.out)
    if problem is None:
        return ResumePlan()
    if os.path.exists(os.path.join(cfg.out, run_folder.SUMMARY)):
        raise ConfigError(f"run folder {cfg.out} holds a finished run; choose a new --out")
    if cfg.resume == "never":
        raise ConfigError(problem)
    saved = load_config(os.path.join(cfg.out, run_folder.CONFIG))
    for name in TrainConfig.field_names():
        if name not in RESUMABLE_CHANGES and getattr(saved, name) != getattr(cfg, name):
            raise ConfigError(
                f"cannot resume {cfg.out}: --{name.replace('_', '-')} is {getattr(cfg, name)!r} "
                f"but the run was started with {getattr(saved, name)!r}")
    path, progress, problems = store.newest_sound()
    notes = [f"skipping damaged checkpoint {p}" for p in problems]
    if path is None and problems:
        raise ConfigError(f"no sound checkpoint to resume in {store.folder}: {problems[0]}")
    return ResumePlan(path, progress, notes)


@dataclass
class World:
    """What depends on the number of workers; recomputed whenever an elastic job resizes."""

    rank: int
    workers: int
    steps: int          # per epoch
    schedule: ScheduleSpec

    @property
    def total_steps(self) -> int:
        return self.schedule.total_steps


def _world(cfg: TrainConfig, data: DataSource) -> World:
    workers = comm.size()
    if cfg.steps_per_epoch and (data.endless or not data.size_is_cheap):
        steps = cfg.steps_per_epoch  # counting every record of a large dataset can wait
    else:
        steps = steps_per_epoch(data.num_train, workers, cfg.batch_size, cfg.steps_per_epoch)
    total = cfg.epochs * steps
    if cfg.mode == "local" and cfg.warm_start_steps >= total:
        raise ConfigError(f"--warm-start-steps {cfg.warm_start_steps} leaves no local steps "
                          f"in a run of {total} steps")
    return World(comm.rank(), workers, steps, ScheduleSpec(
        cfg.base_lr, cfg.batch_size, workers, warmup_steps_for(cfg.warmup_epochs, steps), total,
        cfg.lr_decay))


def train(cfg: TrainConfig, verbose: int | None = None,
          extra_callbacks: tuple[keras.callbacks.Callback, ...] = ()) -> RunResult:
    """Run `cfg` on every worker; `extra_callbacks` go after hvdtrain's own, on every rank."""
    comm.init()
    # Before any TensorFlow op: this pins the worker's GPU(s) or splits the CPU.
    devices = configure_devices(cfg.model_parallel, comm.local_rank())
    start = time.time()
    if cfg.elastic:
        # A worker that joins later runs this function from the top while the others are
        # inside the elastic loop, so nothing before that loop may be a collective call.
        plan = _plan_resume(cfg) if comm.is_chief() else ResumePlan()
    else:
        run_dir = comm.broadcast_object(
            cfg.out or run_folder.default_run_dir(cfg.model, cfg.mode), name="run_dir")
        cfg = replace(cfg, out=run_dir)
        plan = _on_chief(lambda: _plan_resume(cfg), name="resume_plan")
    run_dir = cfg.out

    data = load_dataset(cfg.dataset, cfg.data_dir, parse_shape(cfg.synthetic_shape),
                        seed=cfg.seed, image_size=cfg.image_size)
    if cfg.train_examples is not None:
        if not hasattr(data, "take_train"):
            raise ConfigError(f"--train-examples works with in-memory datasets, not {cfg.dataset}")
        data.take_train(cfg.train_examples)
    if cfg.elastic and not data.size_is_cheap and not cfg.steps_per_epoch:
        raise ConfigError(f"--elastic with --dataset {cfg.dataset} needs --steps-per-epoch "
                          "(counting the records would be a collective call)")
    world = _world(cfg, data)

    # Horovod 0.28.1's allreduce has no XLA kernel, so with several workers the step cannot
    # be compiled whole; auto-clustering compiles the model's ops and leaves Horovod's out.
    jit_whole_step = cfg.xla and world.workers == 1 and not cfg.elastic
    if cfg.xla and not jit_whole_step:
        tf.config.optimizer.set_jit("autoclustering")
    # Set per run, not left over from an earlier run in the same process.
    keras.mixed_precision.set_global_policy("mixed_float16" if cfg.mixed_precision else "float32")
    # The same seed everywhere gives identical initial weights even before the broadcast.
    keras.utils.set_random_seed(cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes,
                        devices=devices if cfg.model_parallel > 1 else None)
    optimizer = make_optimizer(
        cfg, WarmupDecaySchedule.from_spec(world.schedule), averaging=cfg.mode == "sync")
    # jit_compile is never left to Keras's "auto": on a GPU that compiles the whole step,
    # and Horovod's ops have no XLA kernel.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                  jit_compile=jit_whole_step)

    if cfg.mode == "local":
        state_sync = LocalSGD(
            cfg.n_sync, cfg.warm_start_steps, warm_start=cfg.warm_start,
            average_bn_stats=cfg.average_bn_stats,
            average_optimizer_state=cfg.average_optimizer_state,
            outer_optimizer=cfg.outer_optimizer, outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum, fp16_allreduce=cfg.fp16_allreduce)
        callbacks = [state_sync]
    else:
        state_sync = AverageModelStatistics()
        callbacks = [BroadcastInitialState(), state_sync]
    averager = state_sync.attach(model)
    build_optimizer(model)
    in_sync = state_sync.in_sync if cfg.mode == "local" else (lambda: True)
    # Everything a resumed run needs; rank 0 restores it and the state callbacks broadcast it.
    state = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                **({"outer_momentum": averager.buffers} if averager.buffers else {}))
    start_step = 0
    if plan.checkpoint:
        start_step = plan.progress.step
        averager.rounds = plan.progress.sync_count
        if comm.is_chief():
            for note in plan.notes:
                print(f"hvdtrain: {note}", flush=True)
            restore(state, plan.checkpoint)
            print(f"hvdtrain: resuming from {plan.checkpoint} (step {start_step}, epoch "
                  f"{plan.progress.epoch + 1} of {cfg.epochs})", flush=True)
            if (plan.progress.workers, plan.progress.batch_size) != (world.workers, cfg.batch_size):
                print(f"hvdtrain: the checkpoint was written by {plan.progress.workers} workers with "
                      f"batch {plan.progress.batch_size}; continuing with {world.workers} and "
                      f"{cfg.batch_size}: the learning rate follows, the data order restarts",
                      flush=True)
    elif cfg.init_weights and cfg.elastic:
        if comm.is_chief():  # the elastic loop's first sync broadcasts them
            _load_initial_weights(model, cfg.init_weights)
    elif cfg.init_weights:
        _on_chief(lambda: _load_initial_weights(model, cfg.init_weights), name="init_weights")

    store = CheckpointStore(os.path.join(run_dir, run_folder.CHECKPOINTS), cfg.keep_checkpoints)
    checkpointer = Checkpointer(
        store, state, parse_interval(cfg.checkpoint_every),
        progress=lambda: Progress(int(optimizer.iterations.numpy()), world.steps, world.workers,
                                  cfg.batch_size, averager.rounds),
        in_sync=in_sync)
    throughput = ThroughputMeter(cfg.batch_size, world.workers)
    step_log = StepLog(os.path.join(run_dir, run_folder.STEPS), start)
    callbacks += [throughput, MetricAverage(),
                  FiniteLossGuard(lambda: checkpointer.last_saved or plan.checkpoint),
                  step_log, *extra_callbacks]
    rank0_callbacks = [
        MetricsLog(os.path.join(run_dir, run_folder.METRICS), start, lambda: world.workers),
        keras.callbacks.TensorBoard(os.path.join(run_dir, run_folder.TENSORBOARD),
                                       write_graph=False, profile_batch=0),
        checkpointer,
    ]
    if comm.is_chief():
        os.makedirs(run_dir, exist_ok=True)
        files.atomic_write(os.path.join(run_dir, run_folder.CONFIG), cfg.save_yaml)
        for log in (run_folder.METRICS, run_folder.STEPS):
            run_folder.truncate_metrics(os.path.join(run_dir, log), start_step)
    watchdog = [StepWatchdog(cfg.step_timeout)] if cfg.step_timeout else []
    history: dict[str, list[float]] = {}

    def fit_from(first_step: int) -> None:
        """Train from `first_step` to the end with the current workers."""
        chief = [c for c in rank0_callbacks if comm.is_chief()]
        verbosity = verbose if verbose is not None else (
            (1 if sys.stdout.isatty() else 2) if comm.is_chief() else 0)
        # Dropout masks should differ between workers and from a run's earlier part.
        reseed_dropout(model, cfg.seed + world.rank + first_step)
        for phase in fit_phases(first_step, world.steps, cfg.epochs):
            fitted = model.fit(
                data.train(world.rank, world.workers, cfg.batch_size, cfg.seed, phase.first_step),
                initial_epoch=phase.first_epoch, epochs=phase.end_epoch, steps_per_epoch=phase.steps,
                validation_data=data.test(world.rank, world.workers, EVAL_BATCH)
                if cfg.validate else None,
                # The epoch's log and checkpoint come before the elastic commit, which may end
                # this fit; the watchdog goes last, as checkpoint saves count as progress.
                callbacks=callbacks + chief + elastic_callbacks + watchdog, verbose=verbosity,
                shuffle=False)  # the pipeline shuffles, per worker and epoch
            for key, values in fitted.history.items():
                history.setdefault(key, []).extend(values)

    elastic_callbacks: list = []
    with _naming_bad_input(data, world.rank, world.workers):
        if cfg.elastic:
            elastic_state = comm.ElasticState(
                list(model.variables) + list(optimizer.variables) + (averager.buffers or [])
                + [optimizer.averaged_steps], sync_count=averager.rounds)
            elastic_callbacks.append(ElasticCommit(elastic_state, cfg.elastic_commit_every,
                                                   in_sync, lambda: averager.rounds,
                                                   before_commit=step_log.flush))

            @comm.elastic_run
            def fit_elastically(elastic_state):
                nonlocal world
                world = _world(cfg, data)
                averager.rounds = elastic_state.sync_count
                # The step was traced for the old world: rebuild it, with the rate for the new one.
                optimizer.learning_rate = WarmupDecaySchedule.from_spec(world.schedule)
                model.make_train_function(force=True)
                model.make_test_function(force=True)
                averager.retrace()
                throughput.workers = world.workers
                if comm.is_chief():
                    print(f"hvdtrain: training with {world.workers} worker(s) from step "
                          f"{int(optimizer.iterations.numpy())}", flush=True)
                fit_from(int(optimizer.iterations.numpy()))

            fit_elastically(elastic_state)
        else:
            fit_from(start_step)
        train_seconds = time.time() - start
        test_loss, test_accuracy = evaluate(model, data.test(world.rank, world.workers, EVAL_BATCH))

    summary = _summary(cfg, world, model, optimizer, state_sync, averager, throughput, history,
                       start_step, train_seconds, test_loss, test_accuracy)
    if comm.is_chief():
        files.atomic_write(os.path.join(run_dir, run_folder.FINAL_WEIGHTS), model.save_weights)
        files.write_json(os.path.join(run_dir, run_folder.SUMMARY), summary)
        print(f"hvdtrain: test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) | "
              f"{summary['images_per_sec']:.0f} images/sec on {world.workers} worker(s) | "
              f"{train_seconds:.1f} s | run folder: {run_dir}", flush=True)
    return RunResult(model, summary, history, run_dir, data.shard(world.rank, world.workers))


def _summary(cfg: TrainConfig, world: World, model, optimizer, state_sync, averager, throughput,
             history, start_step: int, train_seconds: float, test_loss: float,
             test_accuracy: float) -> dict[str, Any]:
    """summary.json; a collective call (throughput is averaged over workers)."""
    # What went through allreduce: gradients on averaged steps, model state in averaging rounds.
    gradient_steps = int(optimizer.averaged_steps.numpy())
    state_rounds = averager.rounds if world.workers > 1 else 0
    communicated = bytes_allreduced(gradient_steps,
                                    variable_bytes(model.trainable_variables, cfg.fp16_allreduce),
                                    state_rounds, averager.payload_bytes)
    return {
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        # Every worker measured its own rate; the job's is their mean times the workers.
        "images_per_sec": comm.average_scalars({"v": throughput.images_per_sec},
                                               name="final_throughput")["v"],
        "wall_seconds": train_seconds,
        "workers": world.workers,
        "mode": cfg.mode,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "epochs": cfg.epochs,
        "steps_per_epoch": world.steps,
        "total_steps": world.total_steps,
        "steps_run": int(optimizer.iterations.numpy()) - start_step,
        "resumed_from_step": start_step,
        "global_batch": cfg.batch_size * world.workers,
        "peak_lr": world.schedule.peak_lr,
        "parameters": int(model.count_params()),
        "model_parallel": cfg.model_parallel,
        "n_sync": cfg.n_sync if cfg.mode == "local" else 1,
        "sync_count": state_sync.sync_count if cfg.mode == "local" else gradient_steps,
        "gradient_steps_averaged": gradient_steps,
        "bytes_allreduced": communicated,
        "final_train_loss": float(history["loss"][-1]) if history else float("nan"),
        "final_train_accuracy": float(history["accuracy"][-1]) if history else float("nan"),
    }


@contextlib.contextmanager
def _naming_bad_input(data: DataSource, rank: int, workers: int):
    """Turn a decode failure deep in tf.data into one line naming the file at fault."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as exc:
        problem = data.find_bad_input(rank, workers)
        if problem is None:
            raise
        raise DataError(problem) from exc


def evaluate(model: keras.Model, test_ds: tf.data.Dataset) -> tuple[float, float]:
    """Loss and accuracy over the whole test split: each worker its shard, summed exactly."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    @tf.function(autograph=False)  # no Python control flow to convert
    def batch_totals(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                                                 tf.cast(labels, tf.int32)), tf.float64))
        return tf.stack([tf.cast(loss_fn(labels, logits), tf.float64), correct,
                         tf.cast(tf.shape(labels)[0], tf.float64)])

    local = tf.zeros(3, tf.float64)
    for images, labels in test_ds:
        local += batch_totals(images, labels)
    loss_sum, correct, count = comm.total([local], name="evaluation")[0].numpy()
    if count == 0:
        raise DataError("the test split is empty")
    return float(loss_sum / count), float(correct / count)
