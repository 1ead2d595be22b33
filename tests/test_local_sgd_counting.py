"""LocalSGD counts every step, also when Keras runs several per call (steps_per_execution)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import hvdtrain.keras as hk
from hvdtrain.rounds.averaging import sync_points
from hvdtrain.rounds.save_plan import SavePlan


def _fit(local_sgd, steps_per_execution: int, epochs: int = 2, examples: int = 40,
         hidden: bool = False, after=()):
    """`hidden`: a second layer before the output, so the state has two layers to cut.
    `after`: callbacks after `local_sgd`'s, as the runner's checkpointer is."""
    hk.init()  # a world of one worker
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(4)] if hidden else []
    model = keras.Sequential([keras.Input((3,)), *layers, keras.layers.Dense(2)])
    model.compile(hk.with_gradient_averaging(keras.optimizers.SGD(0.1), averaging=False),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(examples, 3)).astype("float32"), rng.integers(0, 2, examples)
    history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[local_sgd, *after])
    return model, history.history


def _fit_again(model, local_sgd, initial_epoch: int, epochs: int, examples: int = 40):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(examples, 3)).astype("float32"), rng.integers(0, 2, examples)
    model.fit(x, y, batch_size=4, initial_epoch=initial_epoch, epochs=epochs, shuffle=False,
              verbose=0, callbacks=[local_sgd])


@pytest.mark.parametrize("per_execution", [1, 2, 5])
def test_every_step_is_counted_whatever_the_steps_per_execution(per_execution):
    local_sgd = hk.LocalSGD(n_sync=5)
    model, history = _fit(local_sgd, per_execution)
    assert local_sgd.progress.steps == int(model.optimizer.iterations.numpy()) == 20
    # Rounds after steps 5 and 10 of each 10-step epoch: as with one step per call.
    assert local_sgd.rounds == len(sync_points(20, 10, 5)) == 4
    assert history["averaging_rounds"] == [2, 4]


def test_a_round_due_inside_an_execution_runs_at_its_end():
    local_sgd = hk.LocalSGD(n_sync=3)
    _fit(local_sgd, 2, epochs=1)  # executions end at steps 2, 4, 6, 8, 10
    # Rounds due after steps 3, 6 and 9 run after steps 4, 6 and 10 (10 is the epoch end).
    assert local_sgd.rounds == 3


def test_without_epoch_rounds_only_the_period_and_the_end_hold_rounds():
    local_sgd = hk.LocalSGD(n_sync=3, epoch_rounds=False)
    _, history = _fit(local_sgd, 1)
    # After steps 3, 6, ..., 18 and at the end (20, the last epoch's end); not at the
    # first epoch's end (10).
    assert local_sgd.rounds == 7
    assert history["averaging_rounds"] == [3, 7]


class _SavedSteps:
    """Stands in for CheckpointStore: notes the step of every save."""

    def __init__(self):
        self.steps = []

    def save(self, state, saved):
        self.steps.append(saved.progress.steps)


@pytest.mark.parametrize("saves, saved", [
    (SavePlan("epochs", 1), [12, 20]),  # the first epoch's waits for the round after 12
    (SavePlan("epochs", 2), [20]),      # the last epoch's end is the run's round
    (SavePlan("steps", 4), [6, 9, 12, 18, 20]),  # each waits for the next round
    (SavePlan(), []),
])
def test_without_epoch_rounds_a_checkpoint_waits_for_the_next_round_and_adds_none(saves, saved):
    from hvdtrain.training.callbacks import Checkpointer

    local_sgd = hk.LocalSGD(n_sync=3, epoch_rounds=False, saves=saves)
    store = _SavedSteps()
    checkpointer = Checkpointer(store, None, saves, local_sgd.progress, 4)
    _, history = _fit(local_sgd, 1, after=[checkpointer])
    # Rounds after steps 3, 6, ..., 18 and at the run's end (20), whatever the saves.
    assert history["averaging_rounds"] == [3, 7]
    assert store.steps == saved


@pytest.mark.parametrize("run_epochs, rounds", [(2, 7), (None, 8)])
def test_without_epoch_rounds_a_fit_ends_in_a_round_only_where_the_run_ends(run_epochs, rounds):
    local_sgd = hk.LocalSGD(n_sync=3, epoch_rounds=False, run_epochs=run_epochs)
    model, _ = _fit(local_sgd, 1, epochs=1)
    _fit_again(model, local_sgd, initial_epoch=1, epochs=2)
    # After steps 3, 6, 9, 12, 15, 18 and 20; without the run's epochs, after 10 too.
    assert local_sgd.rounds == rounds


@pytest.mark.parametrize("timing", [{"overlap": True}, {"sync_seconds": 2.0, "batch_size": 4,
                                                         "epoch_examples": 40}])
def test_without_epoch_rounds_refuses_rounds_that_are_not_blocking_by_steps(timing):
    with pytest.raises(ValueError, match=r"epoch_rounds=False\) needs blocking rounds"):
        hk.LocalSGD(n_sync=3, epoch_rounds=False, **timing)


def test_a_warm_start_that_ends_inside_an_execution_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"warm_start_steps=3\) needs a multiple of the "
                                         r"model's steps_per_execution \(2\)"):
        _fit(hk.LocalSGD(n_sync=4, warm_start_steps=3), 2)


def test_a_fragmented_round_a_save_waits_for_averages_every_fragment_once():
    """Fragments without epoch rounds, a save every 6 steps, a round every 3: the period's
    rounds at a save (6, 12, 18) average the whole state, and nothing more."""
    local_sgd = hk.LocalSGD(n_sync=3, epoch_rounds=False, saves=SavePlan("steps", 6),
                            round_fragments=2)
    _fit(local_sgd, 1, hidden=True)
    parts = local_sgd.averager.parts
    whole = local_sgd.averager.bytes_per_round
    # Rounds after 3, 9 and 15 (fragment 0: the run's rounds before them are even), after
    # 6, 12 and 18 (whole, for the saves) and at the run's end (20, whole).
    assert local_sgd.rounds == 7
    assert local_sgd.progress.state_bytes == 3 * parts[0].bytes_per_round + 4 * whole
