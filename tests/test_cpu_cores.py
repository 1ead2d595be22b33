"""Pinning workers to cores: the slices (pure) and the refusal once TensorFlow runs."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from hvdtrain.cpu_cores import pin_worker, worker_cores
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


def test_pinning_after_tensorflow_started_is_refused_and_changes_nothing():
    tf.constant(1.0) + 1.0  # starts the runtime of this process
    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError, match="--pin-cores must take effect before TensorFlow"):
        pin_worker(0, 1)
    assert os.sched_getaffinity(0) == before
