"""--no-epoch-rounds in the trainer: rounds every --n-sync steps and one at the run's end,
none at the boundaries of the run's `fit` calls nor at saves; a checkpoint waits for the
next round, so it holds the model training goes on from.

One Horovod job of two workers trains every run (SlowMo with momentum, so that a round
too many, or one without the outer step, shows in the weights).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from helpers import runs_on_learnable_data
from hvdtrain.progress import fit_phases

pytestmark = pytest.mark.multiprocess

COMMON = dict(model="lenet", batch_size=8, mode="local", epoch_rounds=False,
              outer_optimizer="slowmo", outer_momentum=0.5, warmup_epochs=0.0,
              lr_decay="constant", keep_checkpoints=10)
RUNS = {
    # 200 examples in global batches of 16: epochs of 13, 12, 13 and 12 steps, one fit each.
    "fits": dict(COMMON, train_examples=200, epochs=4, n_sync=7, checkpoint_every="10000"),
    # Validated at each epoch end, which is also checkpointed.
    "epoch_saves": dict(COMMON, steps_per_epoch=6, epochs=2, n_sync=4, checkpoint_every="1epoch"),
    # Evaluated and checkpointed every 3 steps.
    "step_saves": dict(COMMON, steps_per_epoch=6, epochs=2, n_sync=4, checkpoint_every="3",
                       eval_every=3, validate=False),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("no_epoch_rounds")
    horovodrun("rounds_worker.py", str(root), json.dumps(runs_on_learnable_data(root, RUNS)),
               timeout=600)
    return {name: load_rank_files(str(root), name) for name in RUNS}


def _rounds(rank) -> tuple[int, list[float]]:
    """Rounds of the run, and rounds so far at each epoch's end."""
    summary, history = (json.loads(str(rank[key])) for key in ("summary", "history"))
    return summary["averaging_rounds"], history["averaging_rounds"]


@pytest.mark.ci
@pytest.mark.long  # their job takes 45 seconds here
def test_the_runs_fits_hold_rounds_every_n_sync_steps_and_at_the_runs_end_only(results):
    assert len(fit_phases(0, 200, 4, 16)) == 4  # the run is cut into four fits
    ranks = results["fits"]
    # After steps 7, 14, ..., 49, and the end's after 50; none at the fits' ends (13, 25, 38).
    assert json.loads(str(ranks[0]["summary"]))["total_steps"] == 50
    assert _rounds(ranks[0]) == (50 // 7 + 1, [1, 3, 5, 8])
    # Each worker went on from its own state (and SlowMo's x0) across the fits' boundaries.
    np.testing.assert_array_equal(ranks[1]["final"], ranks[0]["final"])


@pytest.mark.ci
@pytest.mark.long  # their job takes 45 seconds here
def test_the_last_epochs_checkpoint_holds_the_model_the_run_ends_with(results):
    ranks = results["epoch_saves"]
    # After steps 4 and 8, and at the run's end; the first epoch's checkpoint waited for 8.
    assert _rounds(ranks[0]) == (3, [1, 3])
    for rank in ranks:
        np.testing.assert_array_equal(ranks[0]["checkpoint_12"], rank["final"])


@pytest.mark.ci
@pytest.mark.long  # their job takes 45 seconds here
@pytest.mark.parametrize("run, steps", [("epoch_saves", [8]), ("step_saves", [4, 8])])
def test_every_checkpoint_holds_the_model_that_training_went_on_from(results, run, steps):
    ranks = results[run]
    for step in steps:
        for rank in ranks:
            # The state at the start of step `step` + 1, on every worker.
            np.testing.assert_array_equal(ranks[0][f"checkpoint_{step}"], rank["going_on"][step],
                                          err_msg=f"{run}: step {step}")
    if run == "step_saves":
        # Rounds every 4 steps and at the end only: the saves due after steps 3, 6 and 9
        # waited for the rounds after 4, 8 and 12 (the run's end).
        assert _rounds(ranks[0]) == (3, [1, 3])
        assert sorted(k for k in ranks[0] if k.startswith("checkpoint_")) == \
            ["checkpoint_12", "checkpoint_4", "checkpoint_8"]
