"""--n-sync qsr: the quadratic synchronization rule, the trigger that applies it, and the
Keras layer's use of it."""

import math

import pytest

from hvdtrain.rounds.averaging import QSR_LONGEST, quadratic_period
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.periods import QSR_BASE, QuadraticPeriod, parse_period, period_label
from hvdtrain.rounds.triggers import RateFollowingPeriod


@pytest.mark.parametrize("rate, peak, base, growth, expected", [
    (0.1, 0.1, 1, 1.0, 1),        # at the peak: (1)^2
    (0.05, 0.1, 1, 1.0, 4),       # half the peak: four times the period
    (0.025, 0.1, 2, 1.0, 16),
    (0.08, 0.1, 2, 1.0, 2),       # (1.25)^2 = 1.56: the base holds
    (0.1, 0.1, 1, 1.5, 2),        # growth 1.5 at the peak: floor(2.25)
    (0.05, 0.1, 1, 0.5, 1),       # a small growth keeps the base longer
    (0.2, 0.1, 1, 1.0, 1),        # a rate above the peak given is its own peak
    (0.0, 0.1, 1, 1.0, QSR_LONGEST),  # the end of a decay: no more rounds of the period
    (math.nan, 0.1, 1, 1.0, QSR_LONGEST),
    (1e-9, 0.1, 1, 1.0, QSR_LONGEST),  # capped
])
def test_the_period_grows_as_one_over_the_rate_squared_from_the_base(rate, peak, base, growth,
                                                                     expected):
    assert quadratic_period(rate, peak, base, growth) == expected


def test_the_peak_so_far_keeps_the_base_through_a_rising_rate_then_the_period_grows():
    rates = iter([0.01, 0.05, 0.1, 0.1, 0.07, 0.05, 0.03])
    trigger = RateFollowingPeriod(1, 1.0, lambda step: next(rates))
    periods = []
    step = 0
    for _ in range(7):
        step = trigger.next_round
        assert trigger.due(range(step, step + 1)) and not trigger.due(range(step - 1, step))
        trigger.held(step)
        periods.append(trigger.n_sync)
    # warmup 0.01 -> 0.1 keeps 1; 0.07: (0.1/0.07)^2 = 2.04; 0.05: 4; 0.03: 11.1
    assert periods == [1, 1, 1, 1, 2, 4, 11]
    assert trigger.saved() == (0.1, 11, step + 11)


def test_a_restored_trigger_goes_on_with_the_saved_peak_period_and_next_round():
    first = RateFollowingPeriod(2, 1.0, lambda step: 0.1, warm_start_steps=3)
    assert first.next_round == 5 and first.n_sync == 2
    first.held(5)
    first.rate = lambda step: 0.04
    first.held(7)
    second = RateFollowingPeriod(2, 1.0, lambda step: 0.04)
    second.restore(first.saved())
    assert second.saved() == first.saved() == (0.1, 6, 13)
    second.held(13)
    assert second.n_sync == 6  # the saved peak, not the rate read first after the restore


@pytest.mark.parametrize("spec, expected", [
    ("qsr", QuadraticPeriod(QSR_BASE, 1.0)),
    ("qsr:1", QuadraticPeriod(1, 1.0)),
    ("qsr:1:1.5", QuadraticPeriod(1, 1.5)),
    (" QSR:4:.5 ", QuadraticPeriod(4, 0.5)),
])
def test_n_sync_takes_qsr_with_a_base_and_a_growth(spec, expected):
    assert parse_period(spec) == expected
    assert load_config(None, {"mode": "local", "n_sync": spec}).n_sync == spec
    assert period_label(spec, 8, 1) == spec


@pytest.mark.parametrize("value", ["qsr:0", "qsr:1:0", "qsr:1:x", "qsr:", "qsr:1:", "qsr:-1"])
def test_a_bad_qsr_period_is_named_in_one_line(value):
    with pytest.raises(ConfigError, match=r"--n-sync must be a positive integer, got .*qsr"):
        load_config(None, {"mode": "local", "n_sync": value})


def test_qsr_sets_a_period_of_steps_so_rounds_every_t_seconds_refuse_it():
    with pytest.raises(ConfigError, match="--n-sync qsr:1 adapts a period of steps"):
        load_config(None, {"mode": "async", "n_sync": "qsr:1", "sync_seconds": 2.0})
    from hvdtrain.keras.local_sgd import LocalSGD

    with pytest.raises(ValueError, match=r"^LocalSGD\(n_sync='qsr'\) adapts a period of steps"):
        LocalSGD(n_sync="qsr", sync_seconds=2.0, batch_size=4, epoch_examples=10)


def _fitted(n_sync, epochs=1, callbacks=(), overlap=False, first=False):
    """A fit with LocalSGD(n_sync) among `callbacks` (`first`: after them, so they act on
    each step before it does)."""
    import keras
    import numpy as np

    from hvdtrain.keras.local_sgd import LocalSGD

    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    rates = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=32)
    net.compile(keras.optimizers.SGD(rates), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    local = LocalSGD(n_sync=n_sync, overlap=overlap)
    ordered = [*callbacks, local] if first else [local, *callbacks]
    net.fit(x, y, batch_size=2, epochs=epochs, verbose=0, callbacks=ordered)
    return local, net, rates


def test_the_keras_layer_reads_the_optimizers_rate_at_each_round():
    """32 steps of a cosine decay: the rounds fall where the rule, fed the schedule's
    rate at the last step of each round, puts them."""
    from hvdtrain import comm

    comm.init()
    local, _, rates = _fitted("qsr:1")
    expected = RateFollowingPeriod(1, 1.0, None)
    rounds = 0
    while expected.next_round <= 32:
        step = expected.next_round
        expected.rate = lambda step: float(rates(step - 1))
        expected.held(step)
        rounds += 1
    assert local.trigger.saved() == expected.saved()
    assert 4 < rounds < 32  # every step at first, then fewer and fewer
    last = expected.next_round - expected.n_sync
    assert local.rounds == rounds + (last != 32)  # the epoch's end holds a round of its own


def test_overlapped_rounds_set_the_period_from_the_jobs_step_whatever_the_optimizer_counted():
    """A LossScaleOptimizer does not count a step it skipped on overflow, and overlapped
    rounds do not re-align its count: two workers that skipped different steps must still
    set the same periods, the ones of the job's steps."""
    import keras

    from hvdtrain import comm
    from hvdtrain.keras.state import base_optimizer

    class SkipsSteps(keras.callbacks.Callback):  # as an overflow would, before the round
        def on_train_batch_end(self, batch, logs=None):
            if batch in (3, 9, 17):
                base_optimizer(self.model.optimizer).iterations.assign_sub(1)

    comm.init()
    plain, _, _ = _fitted("qsr:1", overlap=True)
    skipping, _, _ = _fitted("qsr:1", overlap=True, callbacks=(SkipsSteps(),), first=True)
    assert skipping.trigger.saved() == plain.trigger.saved()
    assert skipping.rounds == plain.rounds


def test_a_checkpoint_keeps_the_rate_schedule_and_a_new_callback_goes_on_with_it(tmp_path):
    import keras
    import tensorflow as tf

    from hvdtrain import comm
    from hvdtrain.keras.local_sgd import LocalSGD

    comm.init()
    first, trained, _ = _fitted("qsr:1")
    learnt = first.trigger.saved()
    assert learnt[0] == pytest.approx(0.1) and learnt[1] > 1
    path = tf.train.Checkpoint(model=trained, **first.kept_state).write(str(tmp_path / "ckpt"))

    second = LocalSGD(n_sync="qsr:1")
    second.attach(trained)
    tf.train.Checkpoint(model=trained, **second.kept_state).read(path).expect_partial()
    assert second.trigger.saved() != learnt  # the base until training starts
    at_start = []
    seen = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: at_start.append(second.trigger.saved()))
    trained.fit(tf.zeros((2, 3)), tf.zeros((2, 1)), batch_size=2, epochs=1, verbose=0,
                callbacks=[second, seen])
    assert at_start == [learnt]
