"""Overlapped averaging rounds (LocalSGD(overlap=True)) on two ranks; each rank saves what it
held, so the tests can recompute the update rule in numpy and compare the ranks.

usage: overlap_worker.py RESULTS_DIR
"""

import os
import sys

import numpy as np
import keras
import tensorflow as tf

import hvdtrain.keras as hk
from hvdtrain import comm
from hvdtrain.keras.overlap import OverlappedRounds
from hvdtrain.keras.state import ModelStateAverager, build_optimizer

N_SYNC, STEPS_PER_EPOCH, EPOCHS, BATCH = 3, 10, 2, 8


def batch_norm_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    build_optimizer(model)
    return model


def values(model) -> list[np.ndarray]:
    return [v.numpy().copy() for v in ModelStateAverager(model).variables]


def move(model, rank: int, scale: float) -> None:
    """A rank-specific change to every averaged variable; variances stay positive."""
    for i, v in enumerate(ModelStateAverager(model).variables):
        v.assign(v + np.float32(scale * (rank + 1) * (i + 1)))


def set_statistics(model, rank: int, fp16: bool) -> None:
    """Each rank's own BatchNorm statistics (pooling differs from plain averaging only
    then); with fp16 common ones, from which the ranks depart a little, as after a round."""
    bn = model.layers[1]
    sign = 1 if fp16 else 2 * rank - 1
    bn.moving_mean.assign(np.float32([0.5, -1.0, 2.0, 0.0, 1.0, -0.5]) * sign)
    bn.moving_variance.assign(np.float32([1.0, 0.5, 2.0, 0.1, 1.5, 0.3]) * (1 if fp16 else rank + 1))


def update_rule(rank: int, out: dict, fp16: bool) -> None:
    """Snapshot, move on locally, then apply: each rank saves s, x before and x after."""
    # Without fp16 the ranks start apart on purpose; with it they start together (the
    # reference rounds send changes from must be common) and move apart before the round.
    model = batch_norm_model(seed=1 if fp16 else 10 + rank)
    averager = ModelStateAverager(model, compression="fp16" if fp16 else "none")
    set_statistics(model, rank, fp16)
    if fp16:
        averager.reset_anchor()  # the common reference, then each rank's departure from it
        move(model, rank, 0.003)
    rounds = OverlappedRounds(averager)
    rounds.start(step=0)
    out["snapshot"] = values(model)
    move(model, rank, 0.01)  # "training" while the round is in flight
    out["before"] = values(model)
    out["distance"] = rounds.finish().distance
    out["after"] = values(model)
    rounds.close()
    if fp16:  # the reference is the mean now, common again: a blocking round agrees
        move(model, rank, 0.002)
        averager.average()
        out["blocking_after"] = values(model)


class Record(keras.callbacks.Callback):
    """The state at every batch end, just before LocalSGD's hook (`before`) or after it."""

    def __init__(self):
        super().__init__()
        self.states, self.epoch_states = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.states.append(values(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_states.append(values(self.model))


def overlapped_fit(rank: int, out: dict, n_sync: int, prefix: str) -> None:
    model = batch_norm_model(seed=1)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(STEPS_PER_EPOCH * BATCH, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=len(x)).astype(np.int32)
    local_sgd = hk.LocalSGD(n_sync=n_sync, overlap=True)
    before, after = Record(), Record()
    # MetricAverage first: its allreduce runs while the round of step 9 is still in flight.
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[hk.MetricAverage(), before, local_sgd, after])
    out[prefix + "before"] = np.array(before.states, dtype=object)
    out[prefix + "after"] = np.array(after.states, dtype=object)
    out[prefix + "epoch_states"] = np.array(after.epoch_states, dtype=object)
    out[prefix + "rounds"] = local_sgd.rounds
    out[prefix + "state_bytes"] = local_sgd.progress.state_bytes
    out[prefix + "payload_bytes"] = local_sgd.averager.payload_bytes
    out[prefix + "averaging_rounds_log"] = history.history["averaging_rounds"]


def main(results_dir: str) -> None:
    hk.init()
    rank = comm.rank()
    for fp16, stem in ((False, "rule"), (True, "rule_fp16")):
        out: dict = {}
        update_rule(rank, out, fp16)
        save(results_dir, stem, rank, out)
    out = {}
    overlapped_fit(rank, out, N_SYNC, "")
    # n_sync 5 divides the epoch: a round starts at each epoch end, and no blocking round
    # should follow it.
    overlapped_fit(rank, out, 5, "aligned_")
    save(results_dir, "fit", rank, out)


def save(results_dir: str, stem: str, rank: int, out: dict) -> None:
    np.savez(os.path.join(results_dir, f"{stem}-rank{rank}.npz"),
             **{k: np.array(v, dtype=object) if isinstance(v, list) else v for k, v in out.items()})


if __name__ == "__main__":
    main(sys.argv[1])
