"""`make gpu-check` (hvdtrain.benchmarks.gpu_check): what needs no GPU. Its refusal on
a machine without two usable GPUs, NVIDIA's figure for a GPU's name, the NCCL count
from Horovod's timeline, and the verdict on ranks' weights, with made-up job results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hvdtrain.benchmarks import gpu_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Horovod's timeline as its writer leaves it mid-run: "[", events each ending "},", no "]".
TIMELINE = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grads_0"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10, "pid": 1},
{"ph": "E", "ts": 11, "pid": 1},
{"ph": "B", "name": "NCCL_ALLREDUCE", "ts": 12, "pid": 1},
{"ph": "E", "ts": 15, "pid": 1},
{"ph": "B", "name": "NCCL_ALLREDUCE", "ts": 16, "pid": 1},
{"ph": "E", "ts": 19, "pid": 1},
"""
GLOO_TIMELINE = TIMELINE.replace("NCCL_ALLREDUCE", "GLOO_ALLREDUCE")


def results(**changes) -> dict:
    found = {"gpu_name": "NVIDIA A100-SXM4-40GB", "batch_per_gpu": 256,
             "per_worker_images_per_sec": 2000.0, "worker_images_per_sec": [1990.0, 2010.0],
             "devices": ["GPU", "GPU"], "fingerprints": [[1.5, -2.25, 3.0], [1.5, -2.25, 3.0]]}
    return {**found, **changes}


@pytest.mark.parametrize("cuda_build, gpus, expected", [
    (False, 8, "not built with CUDA"),
    (True, 0, "needs 2 GPUs that TensorFlow can use, found 0"),
    (True, 1, "needs 2 GPUs that TensorFlow can use, found 1"),
])
def test_a_machine_without_two_usable_gpus_is_refused_in_one_line(cuda_build, gpus, expected):
    why = gpu_check.refusal(cuda_build, gpus)
    assert expected in why and "\n" not in why


def test_two_gpus_of_a_cuda_build_are_not_refused():
    assert gpu_check.refusal(True, 2) is None


@pytest.mark.long  # a process of 8 seconds here
def test_gpu_check_here_says_why_in_one_line_and_exits_nonzero():
    """This machine has a CPU TensorFlow and no GPU: the check starts no job."""
    done = subprocess.run([sys.executable, "-m", "hvdtrain.benchmarks.gpu_check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("gpu-check:")]
    assert len(lines) == 1 and ("not built with CUDA" in lines[0] or "found 0" in lines[0])
    assert done.stdout == ""


def test_main_refuses_one_gpu_before_starting_a_job(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "gpus_here", lambda: (True, 1))
    monkeypatch.setattr(gpu_check, "run_job", lambda *a: pytest.fail("a job was started"))
    assert gpu_check.main([]) == 1
    assert capsys.readouterr().err.strip() == \
        "gpu-check: needs 2 GPUs that TensorFlow can use, found 1"


@pytest.mark.parametrize("name, precision, expected", [
    ("NVIDIA A100-SXM4-40GB", "amp", ("A100", 2375, 256)),
    ("NVIDIA A100-SXM4-80GB", "fp32", ("A100", 909, 256)),
    ("Tesla V100-SXM2-16GB", "amp", ("V100", 1270, 256)),
    ("Tesla V100-SXM2-16GB", "fp32", ("V100", 412, 128)),
    ("Tesla V100-SXM2-32GB", "amp", ("V100-SXM2-32GB", 1300, 256)),
    ("Tesla V100-SXM3-32GB", "fp32", ("V100-SXM3-32GB", 432, 128)),
])
def test_nvidias_published_figure_is_found_by_the_gpus_name(name, precision, expected):
    assert gpu_check.published_figure(name, precision) == expected


def test_a_gpu_nvidia_lists_no_figure_for_is_reported_as_such():
    assert gpu_check.published_figure("NVIDIA H100 80GB HBM3", "amp") is None
    lines = gpu_check.report(results(gpu_name="NVIDIA H100 80GB HBM3"), "amp")
    assert "2000 images/sec per GPU" in lines[0]
    assert "publishes no ResNet-50 training figure for NVIDIA H100 80GB HBM3" in lines[1]


def test_the_report_puts_the_measured_rate_beside_nvidias():
    first, second = gpu_check.report(results(), "amp")
    assert "2000 images/sec per GPU" in first and "1990 / 2010" in first
    assert "A100 at amp: 2375 images/sec per GPU at batch 256" in second


def test_nccl_allreduces_are_counted_in_a_timeline_cut_short():
    assert gpu_check.nccl_allreduces(TIMELINE) == 2
    assert gpu_check.nccl_allreduces(GLOO_TIMELINE) == 0
    assert gpu_check.nccl_allreduces(TIMELINE.rstrip(",\n") + "\n]\n") == 2  # closed


def test_a_job_on_gpus_through_nccl_whose_ranks_agree_passes():
    assert gpu_check.problems(results(), allreduces=2) == []


def test_allreduces_that_did_not_go_through_nccl_fail_the_check():
    (problem,) = gpu_check.problems(results(), gpu_check.nccl_allreduces(GLOO_TIMELINE))
    assert "no allreduce ran through NCCL" in problem


def test_a_rank_whose_weights_stayed_on_the_cpu_fails_the_check():
    (problem,) = gpu_check.problems(results(devices=["GPU", "CPU"]), allreduces=2)
    assert "rank(s) [1] kept their weights on the CPU" in problem


@pytest.mark.parametrize("second", [[1.5, -2.25, 3.001], [1.5, -2.25]])
def test_ranks_whose_weights_differ_fail_the_check(second):
    (problem,) = gpu_check.problems(results(fingerprints=[[1.5, -2.25, 3.0], second]), 2)
    assert "rank(s) [1] ended with weights that differ from rank 0's" in problem


def test_rounding_in_the_last_digits_is_agreement():
    assert gpu_check.ranks_disagreeing([[1e6, 3.0], [1e6 + 1e-4, 3.0 + 1e-9]]) == []
