"""Runs several hvdtrain trainings in one Horovod job; saves each rank's view of each.

usage: train_worker.py RESULTS_DIR RUNS_JSON
RUNS_JSON is a list of {"name": ..., "config": {TrainConfig overrides}}.
"""

import json
import os
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.training.runner import train


class StepLosses(keras.callbacks.Callback):
    """This rank's own running-mean loss after every step, as Keras logs it."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


class OverflowOn(keras.callbacks.Callback):
    """On one rank, the gradients of chosen steps (1-based, counted over the run's fits)
    overflow: the loss scale is raised past float16's range for that step alone, as a
    mixed-precision worker meets now and then on its own data. The loss stays finite."""

    def __init__(self, rank: int, steps: list[int]):
        super().__init__()
        self.rank, self.steps = rank, set(steps)
        self.step = 0
        self.skipped = 0   # steps whose update the optimizer skipped on this rank
        self._scale = None

    def on_train_batch_begin(self, batch, logs=None):
        self.step += 1
        if comm.rank() == self.rank and self.step in self.steps:
            self._scale = self.model.optimizer.dynamic_scale.numpy()
            self.model.optimizer.dynamic_scale.assign(1e38)

    def on_train_batch_end(self, batch, logs=None):
        if self._scale is not None:
            # Non-finite gradients halve the scale and skip the update; finite ones would
            # leave it (or double it), so a lower scale tells that the step was skipped.
            self.skipped += float(self.model.optimizer.dynamic_scale.numpy()) < 1e38
            self.model.optimizer.dynamic_scale.assign(self._scale)
            self._scale = None


def main(results_dir: str, runs_json: str) -> None:
    comm.init()
    for run in json.loads(runs_json):
        losses = StepLosses()
        overflow = OverflowOn(**run["overflow"]) if "overflow" in run else None
        extra = (losses,) if overflow is None else (overflow, losses)
        result = train(load_config(None, run["config"]), extra_callbacks=extra)
        model = result.model
        np.savez(
            os.path.join(results_dir, f"{run['name']}-rank{comm.rank()}.npz"),
            trainable=np.concatenate([w.numpy().ravel() for w in model.trainable_variables]),
            # Float state only: each worker's dropout seed generators differ on purpose.
            non_trainable=np.concatenate(
                [w.numpy().ravel() for w in model.non_trainable_variables
                 if "float" in w.dtype] or [np.zeros(0)]),
            shard=result.train_shard,
            history=json.dumps(result.history),
            step_losses=np.array(losses.losses),
            summary=json.dumps(result.summary),
            local_size=comm.local_size(), cross_rank=hvd.cross_rank(),
            overflow_skipped=overflow.skipped if overflow else 0,
            optimizer_step=int(model.optimizer.iterations.numpy()),
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
