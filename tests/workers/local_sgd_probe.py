"""LocalSGD in a plain user-written `model.fit`, with each kind of warm start; records every
rank's weights before and after every step's round.

usage: local_sgd_probe.py RESULTS_DIR
"""

import json
import os
import sys

import numpy as np
import keras

import hvdtrain.keras as hk
from hvdtrain.averaging import sync_points

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


def main(results_dir):
    hk.init()
    rank = hk.rank()
    results = {**fit(rank, "sync"), **fit(rank, "single")}

    # MetricAverage on values that differ per rank.
    logs = {"loss": float(rank + 1), "accuracy": 0.5 * rank}
    hk.MetricAverage().on_epoch_end(0, logs)

    np.savez(os.path.join(results_dir, f"probe-rank{rank}.npz"),
             sync_points=np.array(sync_points(STEPS * EPOCHS, STEPS, N_SYNC, WARM)),
             averaged_logs=json.dumps(logs), **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
