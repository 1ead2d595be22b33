"""Horovod's own Keras layer on Keras 3: each of two workers fits one model through
`horovod.tensorflow.keras.DistributedOptimizer` and a twin of it through the bare
optimizer, on its own data, and saves the weights both end with.

This is a statement about Horovod 0.28.1, not about hvdtrain (hence the one Horovod
import outside hvdtrain.comm): the wrapper accepts a Keras 3 optimizer without a word,
and the workers' models then train apart exactly as if no Horovod were there.

usage: horovod_keras_layer_worker.py RESULTS_DIR
"""

import os
import sys

import horovod.tensorflow.keras as hvd
import keras
import numpy as np

STEPS, BATCH = 4, 8


def fitted_weights(optimizer, x, y):
    """A fresh model, the same on every worker, after STEPS steps of `optimizer` on x, y."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    initial = model.get_weights()
    model.compile(optimizer, loss="mse", jit_compile=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return np.concatenate([w.ravel() for w in initial]), \
        np.concatenate([w.ravel() for w in model.get_weights()])


def main(results_dir):
    hvd.init()
    rng = np.random.default_rng(100 + hvd.rank())  # each worker its own data, as a shard
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 1)).astype("float32")
    initial, wrapped = fitted_weights(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), x, y)
    _, bare = fitted_weights(keras.optimizers.SGD(0.1), x, y)
    np.savez(os.path.join(results_dir, f"horovod-keras-rank{hvd.rank()}.npz"),
             initial=initial, wrapped=wrapped, bare=bare)


if __name__ == "__main__":
    main(*sys.argv[1:])
