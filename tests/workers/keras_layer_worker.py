"""Synchronous training through hvdtrain's public Keras layer in a user-written `model.fit`,
with a LossScaleOptimizer, where rank 1 alone meets an overflowing batch.

usage: keras_layer_worker.py RESULTS_DIR
"""

import os
import sys

import keras
import numpy as np

import hvdtrain.keras as hk
from hvdtrain.keras.state import optimizer_slots

STEPS, BATCH, POISONED_STEP = 6, 4, 3
LOCAL_STEPS, WARM_STEPS = 8, 4


class StateRecorder(keras.callbacks.Callback):
    """The weights and the loss scale after every step."""

    def __init__(self):
        super().__init__()
        self.weights, self.scales = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.concatenate([w.numpy().ravel() for w in self.model.weights]))
        self.scales.append(float(self.model.optimizer.dynamic_scale.numpy()))


class MomentumAtBegin(keras.callbacks.Callback):
    """This worker's momentum as the fit starts, after the callbacks before it ran."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_begin(self, logs=None):
        self.values.append(momentum(self.model))


def momentum(model) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in optimizer_slots(model.optimizer)])


def local_with_loss_scaling(rank, results_dir):
    """LocalSGD with a warm start, gradient averaging wrapped around a LossScaleOptimizer
    (as docs/keras-layer.md says to wrap it), and two fits in a row."""
    keras.utils.set_random_seed(20 + rank)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    optimizer = hk.with_gradient_averaging(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(LOCAL_STEPS * BATCH, 5)).astype("float32")
    y = rng.integers(0, 3, size=LOCAL_STEPS * BATCH)
    local_sgd, probe = hk.LocalSGD(n_sync=4, warm_start_steps=WARM_STEPS), MomentumAtBegin()
    ended = []
    for _ in range(2):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[local_sgd, probe])
        ended.append(momentum(model))
    np.savez(os.path.join(results_dir, f"local-rank{rank}.npz"),
             averaged_steps=int(optimizer.averaged_steps.numpy()),
             momentum_at_begin=np.stack(probe.values), momentum_at_end=np.stack(ended),
             weights=np.concatenate([w.numpy().ravel() for w in model.weights]),
             broadcast_bytes=local_sgd.progress.broadcast_bytes)


def main(results_dir):
    hk.init()
    rank = hk.rank()
    local_with_loss_scaling(rank, results_dir)
    keras.utils.set_random_seed(10 + rank)  # different initial weights: the broadcast must fix it
    # No BatchNorm: its moving statistics would take the overflow in the forward pass,
    # which no optimizer can skip.
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    optimizer = hk.with_gradient_averaging(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(rank)  # each worker its own data
    x = rng.normal(size=(STEPS * BATCH, 5)).astype("float32")
    y = rng.integers(0, 3, size=STEPS * BATCH)
    if rank == 1:  # a batch whose loss overflows float32 on this worker only
        x[(POISONED_STEP - 1) * BATCH] = 3e38
    recorder = StateRecorder()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hk.BroadcastInitialState(), recorder, hk.MetricAverage()])
    np.savez(os.path.join(results_dir, f"sync-rank{rank}.npz"),
             weights=np.stack(recorder.weights), scales=np.array(recorder.scales),
             averaged_steps=int(optimizer.averaged_steps.numpy()))


if __name__ == "__main__":
    main(*sys.argv[1:])
