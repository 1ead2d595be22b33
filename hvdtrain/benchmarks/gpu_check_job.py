"""`make gpu-check`'s job, on each worker (hvdtrain.benchmarks.gpu_check starts it):

    python -m hvdtrain.benchmarks.gpu_check_job amp|fp32 BATCH STEPS RESULTS.json

ResNet-50 in sync mode on one random batch made and kept on the worker's GPU (the
device-resident synthetic data of `hvdtrain bench`), through the code path of `hvdtrain
train`. Rank 0 writes what the check reads: each rank's images/sec, the device its
weights lived on, and a fingerprint of its final weights (one sum per variable).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import tensorflow as tf

from hvdtrain import comm
from hvdtrain.benchmarks.scaling import worker_throughput
from hvdtrain.benchmarks.throughput import Setup, train_config
from hvdtrain.benchmarks.timing import StepTimer, all_workers

WARMUP_STEPS = 20


def fingerprint(model) -> list[float]:
    """One float64 sum per weight: equal on two ranks when their weights are."""
    return [float(tf.reduce_sum(tf.cast(w, tf.float64))) for w in model.weights]


def train_and_measure(precision: str, batch: int, steps: int) -> dict:
    from hvdtrain.training.runner import train

    setup = Setup(model="resnet50", batch_size=batch, shape="224x224x3", mode="sync",
                  n_sync=None, steps=steps, warmup_steps=WARMUP_STEPS, window=10,
                  mixed_precision=precision == "amp")
    timer = StepTimer(WARMUP_STEPS)
    scratch = tempfile.mkdtemp(prefix="hvdtrain-gpu-check-")
    try:
        cfg = train_config(setup, WARMUP_STEPS + steps, os.path.join(scratch, "run"), False)
        model = train(cfg, verbose=0, extra_callbacks=(timer,)).model
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rates = worker_throughput(all_workers(timer.step_seconds), setup.window, batch)
    mine = tf.config.get_visible_devices("GPU")  # the worker's own GPU, once pinned
    details = tf.config.experimental.get_device_details(mine[0]) if mine else {}
    # Where the weights live, read as a tensor: GPU:0 of a pinned worker, else CPU:0.
    on_gpu = "GPU" in tf.convert_to_tensor(model.trainable_variables[0]).device
    return {**rates, "batch_per_gpu": batch, "gpu_name": details.get("device_name", "no GPU"),
            "fingerprints": all_workers(fingerprint(model)),
            "devices": ["GPU" if row == [1.0] else "CPU"
                        for row in all_workers([1.0 if on_gpu else 0.0])]}


def main(argv: list[str]) -> int:
    precision, batch, steps, results_path = argv
    results = train_and_measure(precision, int(batch), int(steps))
    if comm.is_chief():
        with open(results_path, "w", encoding="utf-8") as fh:
            json.dump(results, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
