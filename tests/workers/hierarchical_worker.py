"""Hierarchical local SGD on two "hosts" of two workers (horovodrun -np 4 -H
localhost:2,127.0.0.1:2): each rank saves its weights after every step of each run.

usage: hierarchical_worker.py RESULTS_DIR RUNS_JSON
RUNS_JSON is a list of {"name": ..., "config": {TrainConfig overrides}}.
"""

import json
import os
import sys

import keras
import numpy as np

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.training.runner import train


class WeightsAfterSteps(keras.callbacks.Callback):
    """This rank's trainable weights after every step (after LocalSGD's rounds)."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.concatenate(
            [w.numpy().ravel() for w in self.model.trainable_variables]))


def main(results_dir: str, runs_json: str) -> None:
    # No comm.init() here: the first run starts Horovod with the host groups it asks for.
    for run in json.loads(runs_json):
        seen = WeightsAfterSteps()
        result = train(load_config(None, run["config"]), verbose=0, extra_callbacks=(seen,))
        np.savez(
            os.path.join(results_dir, f"{run['name']}-rank{comm.rank()}.npz"),
            steps=np.stack(seen.weights),
            final=np.concatenate([w.numpy().ravel() for w in result.model.trainable_variables]),
            summary=json.dumps(result.summary), host=np.array(comm.host_group().ranks),
            # Each trainable variable's length and shape in `steps` and `final`, in order.
            sizes=np.array([int(np.prod(w.shape)) for w in result.model.trainable_variables]),
            shapes=json.dumps([list(w.shape) for w in result.model.trainable_variables]))


if __name__ == "__main__":
    main(*sys.argv[1:])
