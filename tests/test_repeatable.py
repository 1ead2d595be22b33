"""Repeatable runs with three workers: what --deterministic promises, and that evaluating
within epochs (--eval-every) does not change what is trained.

Two workers repeat bitwise anyway (a + b == b + a); from three on, Horovod's tensor
fusion lets timing decide how sums round, so the test needs three.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import horovodrun
from helpers import weights_in_file, write_learnable_idx_dataset


@pytest.mark.long
@pytest.mark.multiprocess
def test_deterministic_runs_repeat_bitwise_and_evaluations_change_nothing(tmp_path):
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=1200, test=300)
    common = ["hvdtrain", "train", "--data-dir", data_dir, "--epochs", "1",
              "--steps-per-epoch", "12", "--batch-size", "16", "--no-validate",
              "--log-every", "0", "--deterministic"]
    runs = {"first": [], "again": [], "evaluating": ["--eval-every", "4", "--eval-examples", "90"]}
    for name, extra in runs.items():
        horovodrun(*common, *extra, "--out", str(tmp_path / name), np_=3, hosts="localhost:3",
                   timeout=300)
    first = weights_in_file(tmp_path / "first" / "model.weights.h5")
    assert first and any(np.abs(w).sum() > 0 for w in first.values())
    for name in ("again", "evaluating"):
        other = weights_in_file(tmp_path / name / "model.weights.h5")
        assert other.keys() == first.keys()
        for key in first:
            np.testing.assert_array_equal(other[key], first[key], err_msg=f"{name}: {key}")
    lines = (tmp_path / "evaluating" / "metrics.jsonl").read_text().count('"eval": true')
    assert lines == 3  # steps 4, 8 and 12: the evaluations did run


def test_a_group_flattens_to_one_vector_and_back_in_order():
    import tensorflow as tf

    from hvdtrain.comm import flatten, unflatten

    group = [tf.reshape(tf.range(6, dtype=tf.float32), [2, 3]), tf.constant([7.0]),
             tf.zeros([0, 4]), tf.fill([2, 1, 2], 9.0)]
    flat = flatten(group)
    assert flat.shape == (11,) and flat.numpy()[:7].tolist() == [0, 1, 2, 3, 4, 5, 7]
    for got, want in zip(unflatten(flat * 2, group), group):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want.numpy() * 2)
    traced = tf.function(lambda f: unflatten(f, group))(flat)  # inside a traced step too
    np.testing.assert_array_equal(traced[3].numpy(), group[3].numpy())


@pytest.mark.parametrize("threshold, off", [
    (None, False), ("67108864", False), ("0", True), ("fast", False)])
def test_groups_travel_flat_exactly_when_horovods_own_fusion_threshold_is_zero(
        monkeypatch, threshold, off):
    from hvdtrain import comm

    if threshold is None:
        monkeypatch.delenv(comm.FUSION_THRESHOLD, raising=False)
    else:
        monkeypatch.setenv(comm.FUSION_THRESHOLD, threshold)
    assert comm.fusion_is_off() is off
