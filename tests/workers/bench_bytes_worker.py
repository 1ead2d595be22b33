"""A bench row's bytes per round beside a training run's of the same setup, in one job.

usage: bench_bytes_worker.py RESULTS_DIR
Writes bench_bytes-rank{R}.json: per setup, the row's bytes per round (bytes_per_step ×
n_sync) and what the training run's summary counted per round.
"""

import json
import os
import sys

from hvdtrain import comm
from hvdtrain.benchmarks.throughput import Setup, measure
from hvdtrain.config import load_config
from hvdtrain.training.runner import train

N_SYNC = 2
# Neither mode averages the momentum by default; async's rounds go in float16 here.
SETUPS = {"local": dict(mode="local"), "async_fp16": dict(mode="async", fp16_allreduce=True)}


def main(results_dir: str) -> None:
    comm.init()
    found = {}
    for name, options in SETUPS.items():
        row = measure(Setup(model="lenet", batch_size=16, shape="28x28x1", n_sync=N_SYNC,
                            steps=4, warmup_steps=1, window=2, **options))
        # A training run as `hvdtrain train --mode ... --n-sync 2` would make it.
        summary = train(load_config(None, dict(
            model="lenet", dataset="synthetic-device", batch_size=16, epochs=1,
            steps_per_epoch=6, validate=False, n_sync=N_SYNC,
            out=os.path.join(results_dir, name), **options)), verbose=0).summary
        found[name] = {"bench": row["bytes_per_step"] * N_SYNC,
                       "run": summary["bytes_allreduced"] / summary["averaging_rounds"],
                       "gradient_steps": summary["gradient_steps_averaged"]}
    with open(os.path.join(results_dir, f"bench_bytes-rank{comm.rank()}.json"), "w") as fh:
        json.dump(found, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
