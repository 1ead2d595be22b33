"""Two workers fit a small model with gradient averaging, then without; each saves
what its optimizer's exchange clock counted after each fit."""

import os
import sys

import keras
import numpy as np

import hvdtrain.keras as hk


def main(results_dir):
    hk.init()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    optimizer = hk.with_gradient_averaging(keras.optimizers.SGD(0.1))
    model.compile(optimizer, loss="mse", jit_compile=False)
    x, y = np.ones((32, 5), "float32"), np.zeros((32, 3), "float32")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    averaging = optimizer.exchange_clock.read()
    optimizer.averaging_enabled.assign(False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    np.savez(os.path.join(results_dir, f"clock-rank{hk.rank()}.npz"),
             averaging=averaging, after_local=optimizer.exchange_clock.read())


if __name__ == "__main__":
    main(*sys.argv[1:])
