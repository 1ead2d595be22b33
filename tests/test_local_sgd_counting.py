"""LocalSGD counts every step, also when Keras runs several per call (steps_per_execution)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import hvdtrain.keras as hk
from hvdtrain.averaging import sync_points


def _fit(local_sgd, steps_per_execution: int, epochs: int = 2, examples: int = 40):
    hk.init()  # a world of one worker
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(hk.with_gradient_averaging(keras.optimizers.SGD(0.1), averaging=False),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(examples, 3)).astype("float32"), rng.integers(0, 2, examples)
    history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[local_sgd])
    return model, history.history


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


@pytest.mark.parametrize("every, shown", [(1, [10]), (2, []), (0, [])])
def test_without_epoch_rounds_the_average_is_shown_at_the_epoch_ends_asked_for(every, shown):
    local_sgd = hk.LocalSGD(n_sync=3, epoch_rounds=False, epoch_average_every=every)
    calls = []
    show = local_sgd.show_average
    local_sgd.show_average = lambda: (calls.append(local_sgd.progress.steps), show())[1]
    _fit(local_sgd, 1)
    # Epoch ends after steps 10 and 20, neither of them due (rounds after 9 and 18): the
    # last one holds the end's round instead.
    assert calls == shown
    assert local_sgd.rounds == 7


@pytest.mark.parametrize("timing", [{"overlap": True}, {"sync_seconds": 2.0, "batch_size": 4,
                                                         "epoch_examples": 40}])
def test_without_epoch_rounds_refuses_rounds_that_are_not_blocking_by_steps(timing):
    with pytest.raises(ValueError, match=r"epoch_rounds=False\) needs blocking rounds"):
        hk.LocalSGD(n_sync=3, epoch_rounds=False, **timing)


def test_a_warm_start_that_ends_inside_an_execution_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"warm_start_steps=3\) needs a multiple of the "
                                         r"model's steps_per_execution \(2\)"):
        _fit(hk.LocalSGD(n_sync=4, warm_start_steps=3), 2)
