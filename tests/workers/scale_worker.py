"""One hvdtrain training, as `hvdtrain train` runs it, and what it cost this worker.

usage: scale_worker.py RESULTS_DIR CONFIG_JSON
Writes RESULTS_DIR/rank<R>.json (when each stage was reached, peak and current resident
memory, threads, TensorFlow's pool sizes, the summary) and rank<R>.npz (the trained
weights, for consensus). Times are seconds since the epoch; the launcher may put its own
start in HVDTRAIN_LAUNCHED_AT, which is copied to the report, so that launch to first
step can be read off it. For `make test-scale` and the measurements in BENCHMARKS.md
("16 and 32 workers on one machine").
"""

import time

STARTED = time.time()  # before TensorFlow's import, the bulk of a worker's start-up

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from hvdtrain.config import load_config  # noqa: E402
from hvdtrain.training.start import start_worker  # noqa: E402

# As `hvdtrain train` starts a worker: the host check before TensorFlow, then the cores,
# Horovod and the devices (`start_worker`, which the run below reuses rather than repeats,
# so rank 0 warns once); the import's end below is timed after all of that.
CONFIG = load_config(None, json.loads(sys.argv[2]))
start_worker(CONFIG)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvdtrain import comm  # noqa: E402
from hvdtrain.training.runner import train  # noqa: E402

IMPORTED = time.time()


def memory_kib(field: str) -> int:
    """VmHWM (peak), VmRSS (now) or another field of /proc/self/status, in KiB."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class FirstStep(keras.callbacks.Callback):
    """When this worker's fit began (Horovod started, data loaded, model built, and the
    callbacks before this one begun: sync mode's initial broadcast waits for every
    worker), and when its first training step began and ended (its tracing included)."""

    def __init__(self):
        super().__init__()
        self.fit_began = self.began = self.ended = None
        self.rss_kib_before = None

    def on_train_begin(self, logs=None):
        if self.fit_began is None:
            self.fit_began = time.time()

    def on_train_batch_begin(self, batch, logs=None):
        if self.began is None:
            self.began, self.rss_kib_before = time.time(), memory_kib("VmRSS")

    def on_train_batch_end(self, batch, logs=None):
        if self.ended is None:
            self.ended = time.time()


def main(results_dir: str) -> None:
    rss_imported = memory_kib("VmRSS")
    first = FirstStep()
    result = train(CONFIG, extra_callbacks=(first,))
    rank = comm.rank()
    report = {
        "rank": rank, "workers": comm.size(), "local_size": comm.local_size(),
        "launched_at": float(os.environ.get("HVDTRAIN_LAUNCHED_AT", "nan")),
        "started_at": STARTED, "imported_at": IMPORTED,
        "fit_began_at": first.fit_began, "first_step_began_at": first.began, "first_step_ended_at": first.ended,
        "ended_at": time.time(),
        "rss_kib_imported": rss_imported, "rss_kib_first_step": first.rss_kib_before,
        "rss_kib_end": memory_kib("VmRSS"), "peak_rss_kib": memory_kib("VmHWM"),
        # Of the resident memory now: this process's own, and pages of files (TensorFlow's
        # libraries, mostly), which every worker of a host shares.
        "rss_anon_kib_end": memory_kib("RssAnon"), "rss_file_kib_end": memory_kib("RssFile"),
        "threads": len(os.listdir("/proc/self/task")),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "summary": result.summary,
    }
    with open(os.path.join(results_dir, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    np.savez(os.path.join(results_dir, f"rank{rank}.npz"),
             trainable=np.concatenate([w.numpy().ravel() for w in result.model.trainable_variables]))


if __name__ == "__main__":
    main(sys.argv[1])
