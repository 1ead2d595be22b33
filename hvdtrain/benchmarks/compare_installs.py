"""Training throughput of two hvdtrain installs (two virtualenvs), measured in turns.

    python -m hvdtrain.benchmarks.compare_installs OLD_VENV NEW_VENV --repeats 5 \
        --workers 2 --out runs/compare -- --model lenet --epochs 1

Runs the same `hvdtrain train` job (the options after `--`) under horovodrun with each
install's own `horovodrun` and `hvdtrain`, alternating OLD, NEW, OLD, NEW, ... so that
a slow spell of a shared machine hits both alike, and reads `images_per_sec` from each
run's summary.json. Reports each install's mean ± 95% interval and the mean of the
paired ratios NEW/OLD with its interval; writes compare.json. This is how a move to a
new TensorFlow, Keras or Horovod is priced (BENCHMARKS.md). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from hvdtrain.stats import mean_ci95
from hvdtrain.files import write_json


def run_once(venv: str, workers: int, train_args: list[str], out: str) -> float:
    """One training job with `venv`'s tools; its images/sec."""
    bin_dir = os.path.join(os.path.abspath(venv), "bin")
    command = [os.path.join(bin_dir, "horovodrun"), "-np", str(workers),
               "-H", f"localhost:{workers}", "--gloo", os.path.join(bin_dir, "hvdtrain"),
               "train", *train_args, "--out", out]
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
        return float(json.load(fh)["images_per_sec"])


def compare(old: str, new: str, repeats: int, workers: int, train_args: list[str],
            out: str) -> dict:
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for repeat in range(repeats):
        for label, venv in (("old", old), ("new", new)):
            rate = run_once(venv, workers, train_args, os.path.join(out, f"{label}-{repeat}"))
            rates[label].append(rate)
            print(f"repeat {repeat + 1}/{repeats} {label}: {rate:.0f} images/sec", flush=True)
    ratio, ratio_ci = mean_ci95([n / o for o, n in zip(rates["old"], rates["new"])])
    result = {"old": old, "new": new, "workers": workers, "train_args": train_args,
              "images_per_sec": rates, "new_over_old": ratio, "new_over_old_ci95": ratio_ci}
    for label in ("old", "new"):
        result[f"{label}_mean"], result[f"{label}_ci95"] = mean_ci95(rates[label])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="after --: the `hvdtrain train` options of every run")
    parser.add_argument("old_venv", help="virtualenv of the install to compare against")
    parser.add_argument("new_venv", help="virtualenv of the install being priced")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs (default 5)")
    parser.add_argument("--workers", type=int, default=2, help="workers per job (default 2)")
    parser.add_argument("--out", default="runs/compare-installs", help="folder for the runs")
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after `--` belongs to `hvdtrain train`, not to this parser.
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    train_args = argv[split + 1:]
    result = compare(args.old_venv, args.new_venv, args.repeats, args.workers, train_args,
                     args.out)
    write_json(os.path.join(args.out, "compare.json"), result)
    print(f"old {result['old_mean']:.0f} ± {result['old_ci95']:.0f}, new {result['new_mean']:.0f} "
          f"± {result['new_ci95']:.0f} images/sec; new/old {result['new_over_old']:.3f} ± "
          f"{result['new_over_old_ci95']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
