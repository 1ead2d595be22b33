"""LocalSGD in a plain user-written `model.fit`, with each kind of warm start; records every
rank's weights before and after every step's round. Then `epoch_rounds=False`: what each
evaluation sees, and the final weights of fits cut into epochs differently.

usage: local_sgd_probe.py RESULTS_DIR
"""

import json
import os
import sys

import numpy as np
import keras
import tensorflow as tf

import hvdtrain.keras as hk
from hvdtrain.rounds.averaging import sync_points

STEPS, EPOCHS, N_SYNC, WARM = 7, 2, 3, 2


class WeightRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows = []

    def _weights(self):
        return np.concatenate([w.numpy().ravel() for w in self.model.weights])

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append(self._weights())

    def on_epoch_end(self, epoch, logs=None):
        # The epoch's last step is not finished until its epoch-end round has run.
        self.rows[-1] = self._weights()


def fit(rank, warm_start):
    """One user-written fit with LocalSGD; every rank's weights before and after each round."""
    keras.utils.set_random_seed(100 + rank)  # different initial weights: the broadcast must fix it
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(3),
    ])
    optimizer = hk.with_gradient_averaging(keras.optimizers.SGD(0.05, momentum=0.9),
                                           averaging=False)
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(rank)  # each worker its own data
    x = rng.normal(size=(STEPS * 4, 6)).astype("float32")
    y = rng.integers(0, 3, size=STEPS * 4)
    local_sgd = hk.LocalSGD(n_sync=N_SYNC, warm_start_steps=WARM, warm_start=warm_start)
    before, after = WeightRecorder(), WeightRecorder()
    history = model.fit(x, y, batch_size=4, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[before, local_sgd, after, hk.MetricAverage()])
    return {f"{warm_start}_before": np.stack(before.rows), f"{warm_start}_after": np.stack(after.rows),
            f"{warm_start}_rounds": local_sgd.rounds,
            f"{warm_start}_averaged_steps": int(optimizer.averaged_steps.numpy()),
            f"{warm_start}_history": json.dumps(history.history)}


class EvaluatedWeights(keras.callbacks.Callback):
    """The weights at each evaluation's start, as the callbacks after this one see them."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def on_test_begin(self, logs=None):
        self.rows.append(np.concatenate([w.numpy().ravel() for w in self.model.weights]))


def fit_without_epoch_rounds(rank, epochs, steps_per_epoch, epoch_rounds=False):
    """Rounds every 5 steps only; with epochs of 3 steps each evaluated. Returns the final
    weights, the rounds and the weights each evaluation saw, before and after LocalSGD."""
    keras.utils.set_random_seed(7)  # the same start whatever the cut into epochs
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(10 + rank)
    x, y = rng.normal(size=(48, 6)).astype("float32"), rng.integers(0, 3, size=48)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
    local_sgd = hk.LocalSGD(n_sync=5, epoch_rounds=epoch_rounds)
    own, shown = EvaluatedWeights(), EvaluatedWeights()
    validation = (x[:8], y[:8]) if epochs > 1 else None
    model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0,
              validation_data=validation, callbacks=[own, local_sgd, shown])
    return (np.concatenate([w.numpy().ravel() for w in model.weights]), local_sgd.rounds,
            np.stack(own.rows) if own.rows else np.zeros((0,)),
            np.stack(shown.rows) if shown.rows else np.zeros((0,)))


def without_epoch_rounds(rank):
    cut, cut_rounds, own, shown = fit_without_epoch_rounds(rank, epochs=4, steps_per_epoch=3)
    whole, whole_rounds, _, _ = fit_without_epoch_rounds(rank, epochs=1, steps_per_epoch=12)
    with_rounds, with_rounds_rounds, _, _ = fit_without_epoch_rounds(
        rank, epochs=4, steps_per_epoch=3, epoch_rounds=True)
    return {"view_cut": cut, "view_cut_rounds": cut_rounds, "view_own": own,
            "view_shown": shown, "view_whole": whole, "view_whole_rounds": whole_rounds,
            "view_with_rounds": with_rounds, "view_with_rounds_rounds": with_rounds_rounds}


def main(results_dir):
    hk.init()
    rank = hk.rank()
    results = {**fit(rank, "sync"), **fit(rank, "single"), **without_epoch_rounds(rank)}

    # MetricAverage on values that differ per rank.
    logs = {"loss": float(rank + 1), "accuracy": 0.5 * rank}
    hk.MetricAverage().on_epoch_end(0, logs)

    np.savez(os.path.join(results_dir, f"probe-rank{rank}.npz"),
             sync_points=np.array(sync_points(STEPS * EPOCHS, STEPS, N_SYNC, WARM)),
             averaged_logs=json.dumps(logs), **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
