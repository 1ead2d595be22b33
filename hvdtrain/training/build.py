"""Build what a run trains: the compiled model, its optimizer, and the state-averaging callback."""

from __future__ import annotations

import keras
import tensorflow as tf

from hvdtrain.config import LOCAL_MODES, TrainConfig, parse_interval, round_spec
from hvdtrain.data import DataSource
from hvdtrain.keras.callbacks import AverageModelStatistics
from hvdtrain.keras.local_sgd import LocalSGD
from hvdtrain.keras.schedule import WarmupDecaySchedule
from hvdtrain.keras.state import build_optimizer
from hvdtrain.models import build_model
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.training.optimizers import make_optimizer
from hvdtrain.training.world import World


def compiled_model(cfg: TrainConfig, data: DataSource, world: World, devices) -> keras.Model:
    """The model, compiled with its optimizer and the schedule of `world`."""
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
        cfg, WarmupDecaySchedule.from_spec(world.schedule),
        averaging=cfg.mode == "sync" or cfg.hierarchical_sgd)
    # jit_compile is never left to Keras's "auto": on a GPU that compiles the whole step,
    # and Horovod's ops have no XLA kernel.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                  jit_compile=jit_whole_step)
    build_optimizer(model)
    if hasattr(data, "feed_from_device"):
        # The input then lives on the worker's first device, as its first layers do.
        data.feed_from_device(model, cfg.batch_size, devices[0], world.rank)
    return model


def use_world(model: keras.Model, world: World) -> None:
    """Point the optimizer at `world`'s schedule; the compiled steps are traced again."""
    model.optimizer.learning_rate = WarmupDecaySchedule.from_spec(world.schedule)
    model.make_train_function(force=True)
    model.make_test_function(force=True)


def save_plan(cfg: TrainConfig) -> SavePlan:
    """When the run saves (checkpoints) or commits (elastic) its model: one plan, for the
    callbacks that save and for LocalSGD, which must give them the consensus model there."""
    unit, every = parse_interval(cfg.checkpoint_every)
    return SavePlan(unit, every, cfg.elastic_commit_every if cfg.elastic else None)


def state_callback(cfg: TrainConfig, model: keras.Model, progress: TrainingProgress,
                   saves: SavePlan) -> LocalSGD | AverageModelStatistics:
    """What keeps the workers' states together beyond gradients, attached to `model`."""
    if cfg.mode in LOCAL_MODES:
        callback = LocalSGD(round_spec(cfg), progress=progress, batch_size=cfg.batch_size,
                            saves=saves, run_epochs=cfg.epochs)
    else:
        callback = AverageModelStatistics(progress)
    # Now, not at train begin: a checkpoint restores the outer optimizer's buffers into it.
    callback.attach(model)
    return callback


def checkpoint_state(model: keras.Model, state_sync) -> tf.train.Checkpoint:
    """Everything a resumed run needs: weights, statistics, optimizer, and the state
    callback's own (outer momentum, the adaptive period's schedule)."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer, **state_sync.kept_state)


def elastic_variables(model: keras.Model, state_sync) -> list:
    """What an elastic commit keeps in memory and a reset broadcasts."""
    optimizer = model.optimizer
    return (list(model.variables) + list(optimizer.variables)
            + [v for kept in state_sync.kept_state.values() for v in kept]
            + [optimizer.averaged_steps])
