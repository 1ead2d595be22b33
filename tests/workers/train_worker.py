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


def main(results_dir: str, runs_json: str) -> None:
    comm.init()
    for run in json.loads(runs_json):
        losses = StepLosses()
        result = train(load_config(None, run["config"]), extra_callbacks=(losses,))
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
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
