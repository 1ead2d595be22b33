"""Pinning workers to cores: the slices (pure), pinning a fresh process, and the refusal
once TensorFlow runs."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from hvdtrain.machine.cpu_cores import pin_worker, shared_pool_sizes, worker_cores
from hvdtrain.errors import ConfigError


def test_workers_get_equal_consecutive_slices_of_the_allowed_cores():
    allowed = [0, 1, 2, 3, 4, 5, 6, 7]
    assert [worker_cores(allowed, r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [worker_cores(allowed, r, 4) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # Only the cores the process may use, in order, whatever order they came in.
    assert worker_cores([9, 3, 5, 7], 1, 2) == [7, 9]


def test_a_remainder_of_cores_stays_unused_so_no_worker_has_more():
    assert [worker_cores([0, 1, 2, 3, 4], r, 2) for r in range(2)] == [[0, 1], [2, 3]]


def test_fewer_cores_than_workers_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"3 workers on this machine but only 2 core\(s\)"):
        worker_cores([0, 1], 0, 3)
    with pytest.raises(ValueError, match="local rank 2 is not among 2"):
        worker_cores([0, 1], 2, 2)


def test_unpinned_workers_keep_tensorflows_pools_until_they_outnumber_the_cores():
    assert shared_pool_sizes(2, 1) is None and shared_pool_sizes(2, 2) is None
    assert shared_pool_sizes(64, 32) is None  # they lend each other idle cores
    # One compute thread each; two to run a background round beside the step.
    assert shared_pool_sizes(2, 3) == (1, 2) and shared_pool_sizes(2, 32) == (1, 2)


def test_pinning_after_tensorflow_started_is_refused_and_changes_nothing():
    tf.constant(1.0) + 1.0  # starts the runtime of this process
    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError, match="--pin-cores must take effect before TensorFlow"):
        pin_worker(0, 1)
    assert os.sched_getaffinity(0) == before


# In a fresh process, before TensorFlow starts: pin as local rank 1 of 2, start a thread
# afterwards, run an op, and report what each thread may use and TF's pool sizes.
_PIN_SECOND_WORKER = """
import json, os, threading
from hvdtrain.machine.cpu_cores import pin_worker
cores = pin_worker(1, 2)
import tensorflow as tf
later = threading.Thread(target=lambda: None)
later.start(); later.join()
float(tf.reduce_sum(tf.ones([64, 64]) @ tf.ones([64, 64])))
threads = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print(json.dumps({"cores": cores, "threads": threads,
                  "intra": tf.config.threading.get_intra_op_parallelism_threads(),
                  "inter": tf.config.threading.get_inter_op_parallelism_threads()}))
"""


@pytest.mark.long  # a process of 8 seconds here
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to share")
def test_a_pinned_worker_keeps_every_thread_on_its_own_slice_and_sizes_tfs_pools_to_it():
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _PIN_SECOND_WORKER], capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = worker_cores(sorted(os.sched_getaffinity(0)), 1, 2)
    assert report["cores"] == expected
    # Every thread, TensorFlow's pools included (they start after the pinning), stays there.
    assert len(report["threads"]) > 1
    assert all(cores == expected for cores in report["threads"].values())
    assert report["intra"] == len(expected) and report["inter"] == max(2, len(expected))
