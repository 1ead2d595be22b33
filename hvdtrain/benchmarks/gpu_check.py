"""`make gpu-check`: is this GPU host ready for hvdtrain, and how fast is it?

Two workers on two GPUs (horovodrun -np 2 -H localhost:2) train ResNet-50 on random
images kept on each worker's GPU (hvdtrain.benchmarks.gpu_check_job) in sync mode for a
few hundred steps, with Horovod's timeline on. The check passes when the timeline shows
the gradients' allreduces ran through NCCL (which Horovod uses for GPU tensors only:
CPU tensors go through Gloo or MPI), the workers trained on their GPUs, and both ranks
end with the same weights. It prints images/sec per GPU beside NVIDIA's published
figure for that GPU and precision. On a machine without two GPUs that TensorFlow can
use it says so in one line and exits 1.

    python -m hvdtrain.benchmarks.gpu_check [--precision amp|fp32] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

GPUS = 2

# NVIDIA's published ResNet-50 v1.5 training throughput on one GPU, images/sec, with
# the batch per GPU it was measured at: NVIDIA/DeepLearningExamples,
# TensorFlow/Classification/ConvNets/resnet50v1.5/README.md, "Training performance
# results" (TensorFlow 20.06-tf1-py3 NGC container, synthetic data, XLA on; DGX A100
# 40GB, DGX-1 V100 16GB, DGX-2 V100 32GB). "fp32" is TF32 on an A100. Keys are matched
# in order against the device name, so the 32GB V100 comes before the 16GB one.
PUBLISHED = (
    ("A100", {"amp": (2375, 256), "fp32": (909, 256)}),
    ("V100-SXM3-32GB", {"amp": (1300, 256), "fp32": (432, 128)}),
    ("V100-SXM2-32GB", {"amp": (1300, 256), "fp32": (432, 128)}),
    ("V100", {"amp": (1270, 256), "fp32": (412, 128)}),
)
SOURCE = ("NVIDIA DeepLearningExamples, TensorFlow resnet50v1.5 README, 1 GPU, "
          "synthetic data, with XLA")
DEFAULT_BATCH = {"amp": 256, "fp32": 128}


def published_figure(device_name: str, precision: str) -> tuple[str, int, int] | None:
    """(the table's GPU, images/sec, batch per GPU) NVIDIA published for `device_name`
    (as TensorFlow or nvidia-smi names it) at `precision`; None for a GPU it lists not."""
    for key, figures in PUBLISHED:
        if key in device_name and precision in figures:
            return (key, *figures[precision])
    return None


def refusal(cuda_build: bool, gpus: int) -> str | None:
    """Why this machine cannot run the check (one line), or None when it can."""
    if not cuda_build:
        return ("gpu-check: this TensorFlow is not built with CUDA (a CPU setup): run "
                "`GPU=1 make setup` on a GPU host")
    if gpus < GPUS:
        return f"gpu-check: needs {GPUS} GPUs that TensorFlow can use, found {gpus}"
    return None


def nccl_allreduces(timeline: str) -> int:
    """How many allreduces Horovod's timeline (its JSON text, possibly cut short while
    being written) shows running through NCCL."""
    events = json.loads("[" + timeline.strip().lstrip("[").rstrip("],\n") + "]")
    return sum(1 for event in events
               if event.get("ph") == "B" and event.get("name") == "NCCL_ALLREDUCE")


def ranks_disagreeing(fingerprints: list[list[float]], rtol: float = 1e-6) -> list[int]:
    """Ranks whose weight fingerprints (one number per variable) differ from rank 0's."""
    first = fingerprints[0]

    def same(a: float, b: float) -> bool:
        return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))

    return [rank for rank, row in enumerate(fingerprints[1:], start=1)
            if len(row) != len(first) or not all(map(same, row, first))]


def problems(results: dict, allreduces: int) -> list[str]:
    """What the job's results (gpu_check_job's JSON) and its timeline's NCCL allreduce
    count say is wrong, one line each; [] when the check passes."""
    found = []
    if allreduces == 0:
        found.append("no allreduce ran through NCCL (Horovod's timeline): the gradients "
                     "were not GPU tensors, or this Horovod was built without NCCL")
    on_cpu = [rank for rank, device in enumerate(results["devices"]) if device != "GPU"]
    if on_cpu:
        found.append(f"rank(s) {on_cpu} kept their weights on the CPU, not a GPU")
    disagreeing = ranks_disagreeing(results["fingerprints"])
    if disagreeing:
        found.append(f"rank(s) {disagreeing} ended with weights that differ from rank 0's")
    return found


def report(results: dict, precision: str) -> list[str]:
    """Lines: images/sec per GPU, and NVIDIA's figure for the GPU when there is one."""
    name = results["gpu_name"]
    lines = [f"gpu-check: {name}, {precision}, batch {results['batch_per_gpu']} per GPU: "
             f"{results['per_worker_images_per_sec']:.0f} images/sec per GPU "
             f"(by rank: {' / '.join(f'{r:.0f}' for r in results['worker_images_per_sec'])})"]
    figure = published_figure(name, precision)
    if figure is None:
        lines.append(f"gpu-check: NVIDIA publishes no ResNet-50 training figure for {name} "
                     f"at {precision} in {SOURCE}")
    else:
        key, rate, batch = figure
        lines.append(f"gpu-check: NVIDIA's figure for {key} at {precision}: {rate} images/sec "
                     f"per GPU at batch {batch} ({SOURCE}; this check runs without XLA, which "
                     "Horovod's ops in the step rule out)")
    return lines


def gpus_here() -> tuple[bool, int]:
    """(TensorFlow is a CUDA build, the GPUs it sees)."""
    import tensorflow as tf

    return tf.test.is_built_with_cuda(), len(tf.config.list_physical_devices("GPU"))


def run_job(args, folder: str) -> tuple[dict, int]:
    """The two-worker job; (its results, NCCL allreduces in its timeline)."""
    results_path, timeline_path = (os.path.join(folder, name)
                                   for name in ("results.json", "timeline.json"))
    command = ["horovodrun", "-np", str(GPUS), "-H", f"localhost:{GPUS}", sys.executable,
               "-m", "hvdtrain.quiet", "-m", "hvdtrain.benchmarks.gpu_check_job",
               args.precision, str(args.batch_size or DEFAULT_BATCH[args.precision]),
               str(args.steps), results_path]
    job = subprocess.run(command, env=dict(os.environ, HOROVOD_TIMELINE=timeline_path))
    if job.returncode != 0 or not os.path.exists(results_path):
        raise SystemExit(f"gpu-check: the {GPUS}-worker job failed (exit {job.returncode}); "
                         "its output is above")
    with open(results_path, encoding="utf-8") as fh:
        results = json.load(fh)
    with open(timeline_path, encoding="utf-8") as fh:
        return results, nccl_allreduces(fh.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("amp", "fp32"), default="amp")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per GPU (default: 256 for amp, 128 for fp32, as NVIDIA's figures)")
    parser.add_argument("--steps", type=int, default=300, help="timed steps (default: 300)")
    args = parser.parse_args(argv)
    why_not = refusal(*gpus_here())
    if why_not:
        print(why_not, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="hvdtrain-gpu-check-") as folder:
        results, allreduces = run_job(args, folder)
    for line in report(results, args.precision):
        print(line)
    found = problems(results, allreduces)
    for line in found:
        print(f"gpu-check: FAILED: {line}", file=sys.stderr)
    if not found:
        print(f"gpu-check: ok: {allreduces} allreduces through NCCL, both ranks agree")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
