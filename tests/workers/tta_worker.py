"""Trains hvdtrain runs in one Horovod job and records, on each rank, what time to accuracy
relies on: the weights at every step and the local-SGD period in force after every step.

usage: tta_worker.py RESULTS_DIR RUNS_JSON
RUNS_JSON is a list of {"name": ..., "config": {TrainConfig overrides}}. Each rank saves
RESULTS_DIR/<name>-rank<r>.npz with, per step: `steps`, `weights` (all trainable weights,
flat), `periods` (the period in force), `losses` (this rank's running-mean loss), and rank
0's own `accuracy` of the weights over the whole test split, computed alone, unsharded.
"""

import json
import os
import sys

import keras
import numpy as np

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.data import load_dataset
from hvdtrain.training.evaluation import EVAL_BATCH
from hvdtrain.training import runner
from hvdtrain.training.runner import train


class Probe(keras.callbacks.Callback):
    """Runs after every hvdtrain callback, so it sees what an evaluation at this step saw."""

    def __init__(self, test_ds, state_sync_of):
        super().__init__()
        self.test_ds = test_ds
        self.state_sync_of = state_sync_of
        self.rows = {"steps": [], "weights": [], "periods": [], "losses": [], "accuracy": []}

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.rows["steps"].append(step)
        self.rows["weights"].append(np.concatenate(
            [w.numpy().ravel() for w in self.model.trainable_variables]))
        self.rows["periods"].append(self.state_sync_of())
        self.rows["losses"].append(float(logs["loss"]))
        self.rows["accuracy"].append(self._accuracy() if comm.is_chief() else np.nan)

    def _accuracy(self) -> float:
        correct = total = 0
        for images, labels in self.test_ds:
            predicted = np.argmax(self.model(images, training=False).numpy(), axis=-1)
            correct += int(np.sum(predicted == labels.numpy()))
            total += len(labels)
        return correct / total


def main(results_dir: str, runs_json: str) -> None:
    comm.init()
    for run in json.loads(runs_json):
        cfg = load_config(None, run["config"])
        data = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed)
        made = []

        def state_callback(*args, **kwargs):  # keep the run's LocalSGD to ask its period
            made.append(original(*args, **kwargs))
            return made[-1]

        probe = Probe(data.test(0, 1, EVAL_BATCH), lambda: made[-1].period or -1)
        original, runner.state_callback = runner.state_callback, state_callback
        try:
            train(cfg, extra_callbacks=(probe,))
        finally:
            runner.state_callback = original
        np.savez(os.path.join(results_dir, f"{run['name']}-rank{comm.rank()}.npz"),
                 **{k: np.array(v) for k, v in probe.rows.items()})


if __name__ == "__main__":
    main(*sys.argv[1:])
