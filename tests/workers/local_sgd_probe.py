"""LocalSGD in a plain user-written `model.fit`; records every rank's weights after every step.

usage: local_sgd_probe.py RESULTS_DIR
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import hvdtrain.keras as hk
from hvdtrain.averaging import sync_points

STEPS, EPOCHS, N_SYNC, WARM = 7, 2, 3, 2


class WeightRecorder(tf.keras.callbacks.Callback):
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


def main(results_dir):
    hk.init()
    rank = hk.rank()
    tf.keras.utils.set_random_seed(100 + rank)  # different initial weights: the broadcast must fix it
    model = tf.keras.Sequential([
        tf.keras.Input((6,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Dense(3),
    ])
    optimizer = hk.with_gradient_averaging(tf.keras.optimizers.SGD(0.05, momentum=0.9),
                                           averaging=False)
    model.compile(optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(rank)  # each worker its own data
    x = rng.normal(size=(STEPS * 4, 6)).astype("float32")
    y = rng.integers(0, 3, size=STEPS * 4)
    local_sgd = hk.LocalSGD(n_sync=N_SYNC, warm_start_steps=WARM)
    recorder = WeightRecorder()
    history = model.fit(x, y, batch_size=4, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[local_sgd, recorder, hk.MetricAverage()])

    # MetricAverage on values that differ per rank.
    logs = {"loss": float(rank + 1), "accuracy": 0.5 * rank}
    hk.MetricAverage().on_epoch_end(0, logs)

    np.savez(os.path.join(results_dir, f"probe-rank{rank}.npz"),
             weights=np.stack(recorder.rows),
             sync_points=np.array(sync_points(STEPS * EPOCHS, STEPS, N_SYNC, WARM)),
             sync_count=local_sgd.sync_count,
             averaged_steps=int(optimizer.averaged_steps.numpy()),
             history=json.dumps(history.history),
             averaged_logs=json.dumps(logs))


if __name__ == "__main__":
    main(*sys.argv[1:])
