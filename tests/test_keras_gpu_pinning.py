"""`hk.init()` gives each worker of a GPU host its own GPU, as `hvdtrain train` does.

There is no GPU here: TensorFlow's device listing is faked with 8 GPUs (one host of
p4d.24xlarge), and in the horovodrun test with the GPUs CUDA_VISIBLE_DEVICES names.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import hvdtrain.keras as hk
from conftest import horovodrun
from hvdtrain import comm


@pytest.fixture
def eight_gpus(monkeypatch):
    """TensorFlow sees 8 GPUs; returns the calls that set what it may use."""
    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(8)]
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: gpus if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind=None: calls.append(("visible", [d.name for d in devices])))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, enable: calls.append(("growth", device.name, enable)))
    started = []
    monkeypatch.setattr(comm, "init", lambda **kwargs: started.append(kwargs))
    return calls, started


@pytest.mark.parametrize("local_rank", range(8))
def test_each_worker_of_an_8_gpu_host_sees_only_the_gpu_of_its_local_rank(
        eight_gpus, monkeypatch, local_rank):
    calls, started = eight_gpus
    monkeypatch.setattr(comm, "local_rank", lambda: local_rank)
    hk.init(host_groups=True)
    mine = f"/physical_device:GPU:{local_rank}"
    assert calls == [("visible", [mine]), ("growth", mine, True)]
    assert started == [{"host_groups": True}]  # Horovod started first, with the user's options


def test_pin_gpu_false_leaves_every_gpu_visible(eight_gpus, monkeypatch):
    calls, started = eight_gpus
    monkeypatch.setattr(comm, "local_rank", lambda: 3)
    hk.init(pin_gpu=False)
    assert calls == [] and started == [{}]


@pytest.mark.long  # a job of 16 seconds here
@pytest.mark.multiprocess
def test_workers_started_by_horovodrun_take_their_entry_of_cuda_visible_devices(monkeypatch):
    """Horovod's own local ranks, through CUDA's renumbering of the GPUs a job may use
    (Slurm, `docker run --gpus '"device=3,6"'`)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,6")
    result = horovodrun("gpu_pinning_worker.py", timeout=180)
    assert "[0]<stdout>:rank 0 local rank 0 sees GPUs ['3']" in result.stdout
    assert "[1]<stdout>:rank 1 local rank 1 sees GPUs ['6']" in result.stdout
