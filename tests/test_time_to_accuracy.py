"""Time to accuracy: evaluations within epochs (--eval-every) and the adaptive period
(--n-sync auto), in real two-process jobs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from helpers import runs_on_learnable_data

TINY = dict(model="lenet", batch_size=16, epochs=2, train_examples=256, validate=False,
            log_every=0.0)
# 8 steps an epoch on two workers; rounds every 3 steps put evaluations between rounds.
RUNS = {
    "eval_local": dict(TINY, mode="local", n_sync=3, eval_every=5),
    "eval_async": dict(TINY, mode="async", n_sync=3, eval_every=5),
    "eval_sync": dict(TINY, eval_every=5, eval_examples=64),
    # 16 steps an epoch; the period starts at 6 and shrinks as the loss falls.
    "auto_local": dict(TINY, train_examples=512, mode="local", n_sync="auto:6", eval_every=7),
    "auto_async": dict(TINY, train_examples=512, mode="async", n_sync="auto:6"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tta")
    runs = runs_on_learnable_data(root, RUNS)
    horovodrun("tta_worker.py", str(root), json.dumps(runs), timeout=600)
    return root, {name: load_rank_files(str(root), name) for name in RUNS}


def _eval_lines(root, name) -> list[dict]:
    with open(os.path.join(root, f"run-{name}", "metrics.jsonl"), encoding="utf-8") as fh:
        return [r for r in map(json.loads, fh) if r.get("eval")]


@pytest.mark.multiprocess
@pytest.mark.long  # `trained` is one job of about 25 seconds here
@pytest.mark.parametrize("name", ["eval_local", "eval_async"])
def test_eval_every_evaluates_the_consensus_model(trained, name):
    root, results = trained
    ranks = results[name]
    lines = _eval_lines(root, name)
    assert [r["step"] for r in lines] == [5, 10, 15]
    steps = list(ranks[0]["steps"])
    for line in lines:
        i = steps.index(line["step"])
        # Every worker held the same weights when it evaluated ...
        np.testing.assert_array_equal(ranks[0]["weights"][i], ranks[1]["weights"][i])
        # ... and the job's sharded evaluation is that model's accuracy on the whole split.
        assert line["test_accuracy"] == pytest.approx(ranks[0]["accuracy"][i], abs=1e-9)
        assert line["n_sync"] == 3 and line["bytes_allreduced"] > 0
        assert 0 < line["train_seconds"] <= line["wall_seconds"]
    # Between rounds, and without an evaluation, the workers' weights differ.
    i = steps.index(4)
    assert not np.array_equal(ranks[0]["weights"][i], ranks[1]["weights"][i])


@pytest.mark.multiprocess
@pytest.mark.long
def test_eval_examples_evaluates_a_fixed_part_of_the_test_split_in_sync_mode(trained):
    root, _ = trained
    lines = _eval_lines(root, "eval_sync")
    assert [r["step"] for r in lines] == [5, 10, 15]
    # 64 of 128 examples: accuracies are multiples of 1/64.
    for line in lines:
        assert line["n_sync"] == 1
        assert line["test_accuracy"] * 64 == pytest.approx(round(line["test_accuracy"] * 64))


@pytest.mark.multiprocess
@pytest.mark.long
@pytest.mark.parametrize("name", ["auto_local", "auto_async"])
def test_every_rank_holds_the_same_adaptive_period_at_every_step(trained, name):
    root, results = trained
    ranks = results[name]
    # Each worker's own training loss differs from the other's ...
    assert not np.allclose(ranks[0]["losses"], ranks[1]["losses"])
    # ... yet the period they learn from the workers' mean is the same at every step,
    np.testing.assert_array_equal(ranks[0]["periods"], ranks[1]["periods"])
    periods = list(ranks[0]["periods"])
    # and it starts at 6 and shrinks as the loss falls.
    assert periods[0] == 6 and min(periods) < 6
    with open(os.path.join(root, f"run-{name}", "metrics.jsonl"), encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    epochs = [r for r in lines if not r.get("eval")]
    # The epoch's line records the period in force after its last round (an overlapped
    # round in flight is applied then): the one the next epoch starts with.
    assert len(epochs) == 2 and epochs[0]["n_sync"] == periods[16]
    for line in (r for r in lines if r.get("eval")):
        assert line["n_sync"] == periods[line["step"] - 1]
