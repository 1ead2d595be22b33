"""A bench row's bytes per round beside a training run's of the same setup, in one job.

usage: bench_bytes_worker.py RESULTS_DIR
Writes bench_bytes-rank{R}.json: per setup, the row's bytes per round (bytes_per_step ×
n_sync) and what the training run's summary counted per round; for fragmented rounds also
the row's largest burst and the bytes of each of the run's fragments.
"""

import json
import os
import sys

from hvdtrain import comm
from hvdtrain.benchmarks.throughput import Setup, measure
from hvdtrain.config import load_config
from hvdtrain.training.runner import train

N_SYNC = 2
# Neither mode averages the momentum by default; async's rounds go as fp16 compressed
# rounds here (--fp16-allreduce), the int8 run's (local mode's default) as int8 codes and
# scales (the int4 run's two codes a byte), the others' as float32. The fragmented run's 8 steps hold two whole turns of its
# 2 fragments, then the end's round of both.
FLOAT32 = dict(round_compression="none")
SETUPS = {"local": (dict(FLOAT32, mode="local"), 6),
          "async_fp16": (dict(mode="async", fp16_allreduce=True), 6),
          "local_int8": (dict(mode="local", round_compression="int8"), 6),
          "local_int4": (dict(mode="local", round_compression="int4"), 6),
          "local_2_fragments": (dict(FLOAT32, mode="local", round_fragments=2), 8)}


def main(results_dir: str) -> None:
    comm.init()
    found = {}
    for name, (options, steps) in SETUPS.items():
        row = measure(Setup(model="lenet", batch_size=16, shape="28x28x1", n_sync=N_SYNC,
                            steps=4, warmup_steps=1, window=2, **options))
        # A training run as `hvdtrain train --mode ... --n-sync 2` would make it.
        result = train(load_config(None, dict(
            model="lenet", dataset="synthetic-device", batch_size=16, epochs=1,
            steps_per_epoch=steps, validate=False, n_sync=N_SYNC,
            out=os.path.join(results_dir, name), **options)), verbose=0)
        summary, rounds = result.summary, result.summary["averaging_rounds"]
        counted = summary["bytes_allreduced"]
        if "round_fragments" in options:  # the period's rounds, without the end's whole one
            counted, rounds = counted - found["local"]["run"], rounds - 1
            found[name] = {"largest": row["largest_burst_bytes"], "fragments": [
                part.payload_bytes for part in result.state_averager.parts]}
        found[name] = {**found.get(name, {}), "bench": row["bytes_per_step"] * N_SYNC,
                       "run": counted / rounds,
                       "gradient_steps": summary["gradient_steps_averaged"]}
    with open(os.path.join(results_dir, f"bench_bytes-rank{comm.rank()}.json"), "w") as fh:
        json.dump(found, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
