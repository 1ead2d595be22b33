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
    trigger = RateFollowingPeriod(1, 1.0)
    periods = []
    step = 0
    for _ in range(7):
        step = trigger.next_round
        assert trigger.due(range(step, step + 1)) and not trigger.due(range(step - 1, step))
        trigger.learn(next(rates))
        trigger.held(step)
        periods.append(trigger.n_sync)
    # warmup 0.01 -> 0.1 keeps 1; 0.07: (0.1/0.07)^2 = 2.04; 0.05: 4; 0.03: 11.1
    assert periods == [1, 1, 1, 1, 2, 4, 11]
    assert trigger.saved() == (0.1, 11, step + 11)


def test_a_restored_trigger_goes_on_with_the_saved_peak_period_and_next_round():
    first = RateFollowingPeriod(2, 1.0, warm_start_steps=3)
    assert first.next_round == 5 and first.n_sync == 2
    first.learn(0.1)
    first.held(5)
    first.learn(0.04)
    first.held(7)
    second = RateFollowingPeriod(2, 1.0)
    second.restore(first.saved())
    assert second.saved() == first.saved() == (0.1, 6, 13)
    second.learn(0.04)
    second.held(13)
    assert second.n_sync == 6  # the saved peak, not the rate learnt first after the restore


def _host_rates(decay: str, step: int) -> dict[float, tuple[float, float]]:
    """(rate at the peak, rate at `step`) of the trainer's float32 schedule of 100 steps, for
    a host at each of two peaks: 0.075 (a host of 6 workers) and 0.05 (one of 2)."""
    from hvdtrain.keras.schedule import WarmupDecaySchedule
    from hvdtrain.schedules import ScheduleSpec

    rates = {}
    for peak in (0.075, 0.05):
        schedule = WarmupDecaySchedule.from_spec(
            ScheduleSpec(peak, 4, 1, 0, 100, decay, 0.0, 0, "none", 0.0))
        rates[peak] = (float(schedule(0)), float(schedule(step)))
    return rates


@pytest.mark.parametrize("decay, step, growth", [
    ("step", 50, 1.0),     # the step decay's exact tenth: ⌊10²⌋ by float32 rounding
    ("step", 50, 0.2),
    ("cosine", 77, 2.249),  # a cosine rate that lands the rule by a floor: 324 or 323
])
def test_hosts_whose_own_rates_give_different_periods_learn_one_from_their_summed_rates(
        decay, step, growth):
    """Hosts of unequal size train at different rates, in a fixed ratio in exact arithmetic
    but not in float32, and ⌊(G · peak / rate)²⌋ falls on either side of a whole number: each
    worker setting the period from its own rate would part the rounds. Each reports its
    rate instead; all learn the same sum (here 2 workers of one host and 1 of the other),
    so all set the same period."""
    import numpy as np

    from hvdtrain.keras.rate_rounds import RateRounds

    rates = _host_rates(decay, step)
    own = {quadratic_period(rate, peak, 1, growth) for peak, rate in rates.values()}
    assert len(own) == 2, own  # what each host alone would set: the rounds part
    now = {"at": 0}
    workers = [RateRounds(RateFollowingPeriod(1, growth), lambda p=peak: rates[p][now["at"]])
               for peak in (0.075, 0.075, 0.05)]
    for at in (0, 1):  # a round at the peak, then one at `step`
        now["at"] = at
        summed = sum(worker.report() for worker in workers)
        np.testing.assert_array_equal(summed[1], 3.0)
        for worker in workers:
            worker.learn(summed)
    assert len({worker.trigger.saved() for worker in workers}) == 1
    assert min(own) <= workers[0].trigger.n_sync <= max(own)


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


def _fitted(n_sync):
    """One worker's fit of 32 steps of a cosine decay with LocalSGD(n_sync)."""
    import keras
    import numpy as np

    from hvdtrain.keras.local_sgd import LocalSGD

    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    rates = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=32)
    net.compile(keras.optimizers.SGD(rates), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    local = LocalSGD(n_sync=n_sync)
    net.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[local])
    return local, net, rates


def test_the_keras_layer_reads_the_optimizers_rate_at_each_round():
    """32 steps of a cosine decay: the rounds fall where the rule, fed the schedule's
    rate at the last step of each round, puts them."""
    from hvdtrain import comm

    comm.init()
    local, _, rates = _fitted("qsr:1")
    expected = RateFollowingPeriod(1, 1.0)
    rounds = 0
    while expected.next_round <= 32:
        step = expected.next_round
        expected.learn(float(rates(step - 1)))
        expected.held(step)
        rounds += 1
    assert local.trigger.saved() == expected.saved()
    assert 4 < rounds < 32  # every step at first, then fewer and fewer
    last = expected.next_round - expected.n_sync
    assert local.rounds == rounds + (last != 32)  # the epoch's end holds a round of its own


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


@pytest.mark.long  # 10 seconds here
def test_hosts_at_different_rates_set_one_period_and_their_overlapped_rounds_meet():
    """Hierarchical hosts of unequal size train at different peak rates (each scales its
    own: here 0.075 on a host of two, 0.05 on a host of one). A worker that set the period
    from its own rate would set 4 on one host and 3 on the other at the step decay's
    tenth; their overlapped rounds would part, and an epoch end would wait for a round the
    other host never starts. From the summed rates every worker sets the same periods,
    and the job ends."""
    import threading

    import keras
    import numpy as np

    import hvdtrain.keras as hk
    from hvdtrain import comm
    from hvdtrain.keras.schedule import WarmupDecaySchedule
    from hvdtrain.schedules import ScheduleSpec
    from threaded_comm import run_workers

    steps, epochs, peaks, building = 20, 2, {0: 0.075, 1: 0.075, 2: 0.05}, threading.Lock()

    class Periods(keras.callbacks.Callback):
        def __init__(self, local):
            super().__init__()
            self.local, self.seen = local, []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append((self.local.period, self.local.rounds))

    def work(rank):
        schedule = WarmupDecaySchedule.from_spec(
            ScheduleSpec(peaks[rank], 4, 1, 0, steps * epochs, "step", 0.0, 0, "none", 0.0))
        with building:
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(2)])
        model.compile(hk.with_gradient_averaging(keras.optimizers.SGD(schedule), within_host=True),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = np.random.default_rng(comm.rank()).normal(size=(steps * 4, 5)).astype("float32")
        local = hk.LocalSGD(n_sync="qsr:1:0.2", hierarchical=True, overlap=True,
                            round_compression="none")
        seen = Periods(local)
        model.fit(x, (x[:, 0] > 0).astype("int64"), batch_size=4, epochs=epochs, shuffle=False,
                  verbose=0, callbacks=[local, seen])
        return seen.seen, local.trigger.saved()

    ranks = run_workers(3, work, hosts=[(0, 1), (2,)])
    assert ranks[1] == ranks[0] and ranks[2] == ranks[0]
    periods = [period for period, _ in ranks[0][0]]
    assert periods[0] == 1 and periods[-1] > 4, periods  # the base, then longer as the rate decays
