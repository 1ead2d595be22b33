"""ModelStateAverager rounds on two ranks whose state differs in known ways; each rank saves
what it held after each round.

usage: state_averaging_worker.py RESULTS_DIR
"""

import os
import sys

import numpy as np
import keras
import tensorflow as tf

import hvdtrain.keras as hk
from hvdtrain import comm
from hvdtrain.keras.callbacks import AverageModelStatistics
from hvdtrain.keras.state import (ModelStateAverager, OuterOptimizer, build_optimizer,
                                  optimizer_slots)

# Per-rank BatchNorm statistics (3 channels); the tests recompute the pooled values.
BN_MEANS = [np.array([0.0, 1.0, -3.0]), np.array([2.0, 1.0, 5.0])]
BN_VARIANCES = [np.array([1.0, 0.5, 2.0]), np.array([1.0, 0.25, 1.0])]
# With fp16: a shared base and each rank's small departure from it.
BASE_MEAN, BASE_VARIANCE = np.array([10.0, -4.0, 0.5]), np.array([2.0, 0.1, 1.0])
MEAN_STEPS = [np.array([0.01, -0.002, 0.0]), np.array([-0.006, 0.003, 0.0])]
VARIANCE_STEPS = [np.array([0.004, 0.001, -0.2]), np.array([0.0, -0.0005, 0.3])]
SLOT_BASE, SLOT_STEPS = 0.5, [1e-4, -3e-4]
WEIGHT, STEP, INNER_LR = 1.0, 1e-4, 0.1


def one_weight_model() -> keras.Model:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(keras.optimizers.SGD(INNER_LR), "mse")
    build_optimizer(model)
    return model


def batch_norm_model() -> keras.Model:
    """BatchNorm inside a Sequential inside a functional model: found through nesting."""
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    x = keras.Input((3,))
    model = keras.Model(x, keras.layers.Dense(2)(inner(x)))
    model.compile(keras.optimizers.SGD(INNER_LR, momentum=0.9), "mse")
    build_optimizer(model)
    return model


def set_weight(model, value) -> None:
    model.trainable_variables[0].assign(np.full((1, 1), value, np.float32))


def weight(model) -> np.ndarray:
    return model.trainable_variables[0].numpy().ravel()


def set_statistics(model, mean, variance) -> None:
    bn = model.layers[1].layers[-1]
    bn.moving_mean.assign(mean.astype(np.float32))
    bn.moving_variance.assign(variance.astype(np.float32))


def statistics(model) -> np.ndarray:
    bn = model.layers[1].layers[-1]
    return np.stack([bn.moving_mean.numpy(), bn.moving_variance.numpy()])


def fp16_weight_rounds(rank) -> dict:
    """Plain averaging: rank 0 moves by STEP, then rank 1 by 2 STEP from the consensus."""
    model = one_weight_model()
    set_weight(model, WEIGHT)
    averager = ModelStateAverager(model, compression="fp16")
    averager.reset_anchor()
    set_weight(model, WEIGHT + STEP if rank == 0 else WEIGHT)
    # What compressing the weights themselves gives: the change is rounded away.
    (whole,) = comm.average([tf.convert_to_tensor(model.trainable_variables[0])], fp16=True)
    averager.average()
    first = weight(model)
    if rank == 1:
        set_weight(model, first + 2 * STEP)
    averager.average()
    return {"fp16_whole": whole.numpy().ravel(), "fp16_round1": first,
            "fp16_round2": weight(model), "fp16_payload": averager.payload_bytes}


def fp16_slowmo_rounds(rank) -> dict:
    """SlowMo (momentum 0.5): rank 0 moves by STEP in round 1, both by STEP in round 2."""
    model = one_weight_model()
    set_weight(model, WEIGHT)
    averager = ModelStateAverager(model, outer=OuterOptimizer(1.0, 0.5), compression="fp16")
    averager.reset_anchor()
    rows = []
    for moves in ((STEP, 0.0), (STEP, STEP)):
        set_weight(model, weight(model)[0] + moves[rank])
        averager.average(apply_outer=True)
        rows.append(np.concatenate([weight(model), averager.buffers[0].numpy().ravel(),
                                    averager.anchor[0].numpy().ravel()]))
    return {"slowmo": np.stack(rows)}


def fp16_take_chief(rank) -> dict:
    model = one_weight_model()
    set_weight(model, WEIGHT)
    averager = ModelStateAverager(model, compression="fp16")
    averager.reset_anchor()
    set_weight(model, WEIGHT + STEP if rank == 0 else WEIGHT - 3 * STEP)
    averager.average(apply_outer=False, take_chief=True)
    return {"chief": weight(model)}


def pooled_statistics(rank) -> dict:
    """Float32 rounds: averaging, sync mode's callback, and a hand-over from rank 0."""
    out = {}
    for name in ("pooled", "sync_mode", "pooled_chief"):
        model = batch_norm_model()
        set_statistics(model, BN_MEANS[rank], BN_VARIANCES[rank])
        if name == "sync_mode":
            AverageModelStatistics().attach(model).average()
        else:
            ModelStateAverager(model).average(take_chief=name == "pooled_chief")
        out[name] = statistics(model)
    return out


def pooled_fp16(rank) -> dict:
    """Statistics and optimizer slots that moved a little from a shared state, with fp16."""
    model = batch_norm_model()
    set_statistics(model, BASE_MEAN, BASE_VARIANCE)
    slots = optimizer_slots(model.optimizer)
    for slot in slots:
        slot.assign(tf.fill(slot.shape, SLOT_BASE))
    averager = ModelStateAverager(model, optimizer_state=True, compression="fp16")
    averager.reset_anchor()
    set_statistics(model, BASE_MEAN + MEAN_STEPS[rank], BASE_VARIANCE + VARIANCE_STEPS[rank])
    for slot in slots:
        slot.assign(tf.fill(slot.shape, SLOT_BASE + SLOT_STEPS[rank]))
    averager.average()
    return {"pooled_fp16": statistics(model),
            "slots_fp16": np.concatenate([s.numpy().ravel() for s in slots])}


# The case: a reference of 5.5e-8 and values of 2e-8 on both ranks. The change,
# -3.5e-8, is below float16's smallest subnormal step (6e-8), rounds to -6e-8, and the
# reference plus it is -4.6e-9 unless the round floors it.
SQUARE_REFERENCE, SQUARE_NOW = 5.5e-8, 2e-8


def non_negative_slot_rounds(rank) -> dict:
    """fp16 rounds (averaging and the hand-over from rank 0) on optimizers whose slots
    hold running squares or norms; every slot starts at the reference, then drops."""
    results = {}
    for name in ("Adam", "Adadelta", "Adamax"):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        model.compile(getattr(keras.optimizers, name)(INNER_LR), "mse")
        build_optimizer(model)
        slots = optimizer_slots(model.optimizer)
        averager = ModelStateAverager(model, optimizer_state=True, compression="fp16")
        for take_chief in (False, True):
            for slot in slots:
                slot.assign(tf.fill(slot.shape, SQUARE_REFERENCE))
            averager.reset_anchor()
            for slot in slots:
                slot.assign(tf.fill(slot.shape, SQUARE_NOW))
            averager.average(take_chief=take_chief)
            positions = averager.non_negative_positions
            kind = "chief" if take_chief else "mean"
            results[f"squares_{name}_{kind}"] = np.concatenate(
                [averager.variables[j].numpy().ravel() for j in positions] + [np.zeros(0)])
    return results


def local_sgd_fit(rank) -> dict:
    """LocalSGD with fp16 (`fp16_allreduce`, another name for round_compression="fp16")
    and SlowMo in model.fit, from different initial weights: the references must be reset
    after the initial broadcast for the rounds to agree."""
    keras.utils.set_random_seed(10 + rank)
    model = batch_norm_model()
    rng = np.random.default_rng(rank)
    x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    callback = hk.LocalSGD(n_sync=2, outer_optimizer="slowmo", outer_momentum=0.5,
                           average_optimizer_state=True, fp16_allreduce=True)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    return {"fit_state": np.concatenate([w.numpy().ravel() for w in model.weights])}


def main(results_dir):
    comm.init()
    rank = comm.rank()
    results = {**fp16_weight_rounds(rank), **fp16_slowmo_rounds(rank), **fp16_take_chief(rank),
               **pooled_statistics(rank), **pooled_fp16(rank), **local_sgd_fit(rank),
               **non_negative_slot_rounds(rank)}
    np.savez(os.path.join(results_dir, f"state-rank{rank}.npz"), **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
