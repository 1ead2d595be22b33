"""Two workers of which rank 1 starts late; what the job reported beside when each batch ended.

usage: throughput_worker.py RESULTS_DIR LATE_SECONDS
Writes throughput-rank{R}.json: this rank's batch end times (time.time()), when its
epoch ended (its callbacks after the throughput meter's), the epoch's images_per_sec as
logged, the summary, and the batch size.
"""

import json
import os
import sys
import time

import keras

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.training.runner import train

BATCH = 16


class LateStart(keras.callbacks.Callback):
    """Rank 1 starts its first step `seconds` after rank 0 has ended its last (told by a
    file `done`), as a worker on a slow or busy host would: a fixed sleep alone could be
    swallowed by rank 0's own start-up on a loaded machine."""

    def __init__(self, seconds: float, done: str):
        super().__init__()
        self.seconds = seconds
        self.done = done

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0 and comm.rank() == 1:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.done) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(self.seconds)


class BatchEnds(keras.callbacks.Callback):
    def __init__(self, done: str):
        super().__init__()
        self.ends, self.logged, self.epoch_ends = [], [], []
        self.done = done

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.time())
        if comm.rank() == 0 and batch + 1 == self.params["steps"]:
            open(self.done, "w", encoding="utf-8").close()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(time.time())
        self.logged.append(float(logs["images_per_sec"]))


def main(results_dir: str, late_seconds: str) -> None:
    comm.init()
    done = os.path.join(results_dir, "rank0-done")
    ends = BatchEnds(done)
    # Local SGD with no round within the epoch: the workers step without waiting for
    # each other until the epoch's end. No divergence guard: its check at step 20 is a
    # collective, which held rank 0 inside its last step until rank 1's 120 s deadline.
    cfg = load_config(None, dict(model="lenet", dataset="synthetic-device", batch_size=BATCH,
                                 epochs=1, steps_per_epoch=20, validate=False, mode="local",
                                 n_sync=1000, divergence_guard=False,
                                 out=os.path.join(results_dir, "run")))
    result = train(cfg, verbose=0, extra_callbacks=(LateStart(float(late_seconds), done), ends))
    with open(os.path.join(results_dir, f"throughput-rank{comm.rank()}.json"), "w") as fh:
        json.dump({"ends": ends.ends, "epoch_ends": ends.epoch_ends, "logged": ends.logged,
                   "summary": result.summary, "batch": BATCH}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
