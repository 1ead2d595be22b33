"""Trainer runs whose local SGD rounds are under test; each rank saves what it trained.

Per rank: the trainable weights at the start of every step (the state training goes on
from, after LocalSGD has done its part), the final ones, the epoch logs and the summary.
Rank 0 also saves the model weights of every checkpoint the run kept.

usage: rounds_worker.py RESULTS_DIR RUNS_JSON
RUNS_JSON is a list of {"name": ..., "config": {TrainConfig overrides}}.
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.training.checkpoints import STATE_PREFIX, CheckpointStore
from hvdtrain.training.run_folder import CHECKPOINTS
from hvdtrain.training.runner import train


def trainable(model) -> np.ndarray:
    return np.concatenate([w.numpy().ravel() for w in model.trainable_variables])


class GoingOnFrom(keras.callbacks.Callback):
    """This rank's trainable weights at the start of each step, by the steps before it."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_begin(self, batch, logs=None):
        self.weights.append(trainable(self.model))


def checkpointed(model, run_dir: str) -> dict[str, np.ndarray]:
    """The model weights of each checkpoint, by its step (restored into `model`)."""
    saved = {}
    for path in CheckpointStore(os.path.join(run_dir, CHECKPOINTS)).checkpoints():
        tf.train.Checkpoint(model=model).read(os.path.join(path, STATE_PREFIX)).expect_partial()
        saved[f"checkpoint_{int(path.rsplit('-', 1)[1])}"] = trainable(model)
    return saved


def main(results_dir: str, runs_json: str) -> None:
    comm.init()
    for run in json.loads(runs_json):
        going_on = GoingOnFrom()
        result = train(load_config(None, run["config"]), verbose=0, extra_callbacks=(going_on,))
        final = trainable(result.model)
        saved = checkpointed(result.model, result.run_dir) if comm.is_chief() else {}
        np.savez(os.path.join(results_dir, f"{run['name']}-rank{comm.rank()}.npz"),
                 going_on=np.stack(going_on.weights), final=final,
                 history=json.dumps(result.history), summary=json.dumps(result.summary),
                 **saved)


if __name__ == "__main__":
    main(*sys.argv[1:])
