"""A worker's start (hvdtrain.training.start): its cores and TensorFlow's thread pools are
set from horovodrun's environment before Horovod starts, whose host groups start
TensorFlow's runtime. Fresh processes with Horovod's start faked, then one real job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import horovodrun
from hvdtrain.config import load_config
from hvdtrain.machine.cpu_cores import pool_sizes, shared_pool_sizes, worker_cores
from hvdtrain.errors import ConfigError
from hvdtrain.machine.share import MachineShare
from hvdtrain.training import start

# What Horovod's start finds (pools, cores), then what its host groups do: their names
# travel in a collective call, which starts TensorFlow's runtime.
_START = """
import json, os, sys
import tensorflow as tf
from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.training.start import start_worker

seen = {}
def horovod_starting(fuse_tensors=True, host_groups=False, rendezvous_seconds=None):
    seen.update(pools=[tf.config.threading.get_intra_op_parallelism_threads(),
                       tf.config.threading.get_inter_op_parallelism_threads()],
                cores=sorted(os.sched_getaffinity(0)), host_groups=host_groups)
    float(tf.constant(1.0) + 1.0)
comm.init = horovod_starting
started = start_worker(load_config(None, json.loads(sys.argv[1])))
print(json.dumps(dict(seen, cores_per_worker=started.cores)))
"""
HIERARCHICAL = dict(mode="local", hierarchical_sgd=True)
CORES = sorted(os.sched_getaffinity(0))


def _start(options: dict, environ: dict[str, str]) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **environ)
    result = subprocess.run([sys.executable, "-c", _START, json.dumps(options)],
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.long  # 8 to 10 seconds here
@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to share")
def test_a_hierarchical_worker_is_pinned_before_horovod_starts_tensorflows_runtime():
    seen = _start(dict(HIERARCHICAL, pin_cores=True),
                  {"HOROVOD_RANK": "1", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"})
    mine = worker_cores(CORES, 1, 2)
    assert seen["host_groups"] and seen["cores"] == mine
    assert seen["pools"] == list(pool_sizes(len(mine))) and seen["cores_per_worker"] == len(mine)


@pytest.mark.long  # 8 to 10 seconds here
def test_emulated_hosts_size_the_pools_by_the_whole_jobs_workers_before_horovod_starts():
    # One worker on each of len(CORES) + 1 emulated hosts: more workers than the cores.
    workers = len(CORES) + 1
    seen = _start(HIERARCHICAL, {"HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "1",
                                 "HOROVOD_RANK": "0", "HOROVOD_SIZE": str(workers),
                                 "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1"})
    assert seen["host_groups"]
    assert seen["pools"] == list(shared_pool_sizes(len(CORES), workers))
    assert seen["cores_per_worker"] == round(len(CORES) / workers, 3)


def test_a_later_run_cannot_pin_a_worker_started_unpinned(monkeypatch):
    # An earlier run of this process (a bench setup, a test) started it unpinned.
    monkeypatch.setattr(start, "_started", start.StartedWorker(MachineShare(), False, 2.0, []))
    with pytest.raises(ConfigError, match="--pin-cores is set when a worker starts: this "
                                          "process started without it"):
        start.start_worker(load_config(None, {"pin_cores": True}))


@pytest.mark.multiprocess
@pytest.mark.long  # the order is checked in one process above; --pin-cores keeps its own
def test_pinned_workers_can_train_hierarchically(tmp_path):  # job in test_multiprocess
    """--pin-cores with --hierarchical-sgd: each worker takes its cores before its host
    groups start TensorFlow's runtime (once refused: the pinning came after them)."""
    out = tmp_path / "run"
    horovodrun("hvdtrain", "train", "--mode", "local", "--hierarchical-sgd", "--pin-cores",
               "--model", "lenet", "--dataset", "synthetic", "--synthetic-shape", "28x28x1",
               "--batch-size", "16", "--epochs", "1", "--steps-per-epoch", "3",
               "--no-validate", "--out", str(out), timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hierarchical"] is True and summary["workers"] == 2
    assert summary["cores_per_worker"] == len(os.sched_getaffinity(0)) // 2
