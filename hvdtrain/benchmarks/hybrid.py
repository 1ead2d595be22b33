"""Yadan et al. (2013), Table 1, at this machine's scale.

Trains the two-column AlexNet on synthetic data in the four layouts that can run on
one machine: one device; model-parallel over two devices; data-parallel over two
workers; and the hybrid, two workers of two devices each. The global batch is the
same in all four (as in the paper, where it stayed 256), so images/sec compares
time to train an epoch. Each layout is a real `hvdtrain train` run; the rate is the
one in its summary.json (first batch of each epoch excluded).

    python -m hvdtrain.benchmarks.hybrid --global-batch 64 --image-size 64 --steps 20

On a CPU the "devices" are logical CPU devices sharing the same cores, so model
parallelism cannot speed anything up here; the table shows its overhead instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from hvdtrain.benchmarks.launching import horovodrun_command, run_job, tool

LAYOUTS = (
    ("one device", 1, 1),
    ("model-parallel, 2 devices", 1, 2),
    ("data-parallel, 2 workers", 2, 1),
    ("model + data, 2 workers x 2 devices", 2, 2),
)


def train_command(workers: int, model_parallel: int, batch: int, args, out: str) -> list[str]:
    train = [tool("hvdtrain"), "train", "--model", "alexnet-2col",
             "--model-parallel", str(model_parallel), "--dataset", "synthetic",
             "--synthetic-shape", f"{args.image_size}x{args.image_size}x3",
             "--batch-size", str(batch), "--epochs", "2", "--steps-per-epoch", str(args.steps),
             "--no-validate", "--checkpoint-every", "1000epochs", "--out", out]
    return horovodrun_command(workers, train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--global-batch", type=int, default=64, help="images per step, all workers")
    parser.add_argument("--image-size", type=int, default=64, help="side of the synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (2 epochs)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    rows = []
    scratch = tempfile.mkdtemp(prefix="hvdtrain-hybrid-")
    try:
        for name, workers, model_parallel in LAYOUTS:
            out = os.path.join(scratch, f"w{workers}-mp{model_parallel}")
            command = train_command(workers, model_parallel, args.global_batch // workers, args, out)
            result = run_job(command)
            if result.returncode != 0:
                print(result.stdout[-2000:], result.stderr[-2000:], file=sys.stderr)
                return result.returncode
            with open(os.path.join(out, "summary.json")) as fh:
                summary = json.load(fh)
            rows.append({"layout": name, "workers": workers, "devices_per_worker": model_parallel,
                         "images_per_sec": summary["images_per_sec"]})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = rows[0]["images_per_sec"]
    print("| layout | workers | devices per worker | images/sec | vs one device |")
    print("|---|---|---|---|---|")
    for row in rows:
        row["speedup"] = row["images_per_sec"] / base
        print(f"| {row['layout']} | {row['workers']} | {row['devices_per_worker']} | "
              f"{row['images_per_sec']:.0f} | {row['speedup']:.2f}x |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
