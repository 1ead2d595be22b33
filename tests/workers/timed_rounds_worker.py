"""Rounds every T seconds (`--sync-seconds`) with rank 1 four times slower, through the
trainer; each rank saves what it saw at every epoch end.

usage: timed_rounds_worker.py RESULTS_DIR
"""

import json
import os
import sys

import keras
import numpy as np

import hvdtrain.keras as hk
from hvdtrain import comm
from hvdtrain.benchmarks.timing import SlowerSteps
from hvdtrain.config import load_config
from hvdtrain.training.runner import train

EPOCH_EXAMPLES, BATCH = 2048, 16


class EpochEnds(keras.callbacks.Callback):
    """This rank's steps, and its state and counts at each epoch end (after LocalSGD)."""

    def __init__(self):
        super().__init__()
        self.steps, self.weights, self.iterations, self.rounds = 0, [], [], []

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(np.concatenate([w.numpy().ravel() for w in self.model.weights]))
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))
        self.rounds.append(int(logs["averaging_rounds"]))


def long_periods(results_dir: str) -> None:
    """Periods far longer than an epoch (2 global steps): a round carries the count past
    several epoch boundaries at once."""
    out = os.path.join(results_dir, "run-long")
    cfg = load_config(None, dict(
        model="lenet", dataset="synthetic", train_examples=2 * 2 * BATCH, batch_size=BATCH,
        epochs=3, mode="local", sync_seconds=1.0, validate=False, out=out, seed=3))
    result = train(cfg, verbose=0)
    np.savez(os.path.join(results_dir, f"long-rank{comm.rank()}.npz"),
             summary=json.dumps(result.summary), out=out)


def fit_of_many_epochs(results_dir: str) -> None:
    """A user's fit of 3 epochs with timed rounds: refused on every rank, in one line."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    data = np.zeros((8, 2), np.float32), np.zeros((8, 1), np.float32)
    try:
        model.fit(*data, batch_size=4, epochs=3, verbose=0,
                  callbacks=[hk.LocalSGD(sync_seconds=1.0, batch_size=4, epoch_examples=16)])
        message = ""
    except ValueError as exc:
        message = str(exc)
    np.savez(os.path.join(results_dir, f"refused-rank{comm.rank()}.npz"), message=message)


def main(results_dir: str) -> None:
    comm.init()
    long_periods(results_dir)
    fit_of_many_epochs(results_dir)
    # "slowmo": SlowMo's outer step divides by the inner rate, which must be the job's on
    # both ranks although the slow one took fewer steps.
    slowmo = dict(mode="local", outer_optimizer="slowmo", outer_momentum=0.5)
    for name, options in (("local", dict(mode="local")), ("async", dict(mode="async")),
                          ("slowmo", slowmo)):
        seen = EpochEnds()
        out = os.path.join(results_dir, f"run-{name}")
        cfg = load_config(None, dict(
            model="lenet", dataset="synthetic", train_examples=EPOCH_EXAMPLES, batch_size=BATCH,
            epochs=2, sync_seconds=0.4, validate=False, out=out, seed=3, **options))
        result = train(cfg, verbose=0, extra_callbacks=(SlowerSteps(1, 4.0), seen))
        np.savez(os.path.join(results_dir, f"{name}-rank{comm.rank()}.npz"),
                 steps=seen.steps, weights=np.stack(seen.weights), iterations=seen.iterations,
                 rounds=seen.rounds, summary=json.dumps(result.summary), out=out)


if __name__ == "__main__":
    main(*sys.argv[1:])
