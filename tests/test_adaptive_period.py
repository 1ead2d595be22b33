"""--n-sync auto: AdaComm's rule, the trigger that applies it, and the loss it learns from."""

import math

import pytest

from hvdtrain.rounds.averaging import adacomm_period
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.periods import (AUTO_INITIAL_PERIOD, AutoPeriod, PerWorkerPeriod, parse_period,
                              resolve_period)
from hvdtrain.rounds.triggers import AdaptivePeriod, LossSinceRound


@pytest.mark.parametrize("loss, initial, tau0, minimum, expected", [
    (2.0, 2.0, 32, 1, 32),       # no progress yet: the first period
    (0.5, 2.0, 32, 1, 16),       # a quarter of the loss: half the period
    (0.09, 1.0, 10, 1, 3),       # √0.09 · 10 is 3, not 3.0000000000000004 rounded up
    (0.1, 1.0, 10, 1, 4),        # √0.1 · 10 = 3.16: rounded up
    (0.001, 2.0, 32, 2, 2),      # never below the minimum
    (0.0, 2.0, 32, 1, 1),
    (5.0, 2.0, 32, 1, 32),       # an early spike does not lengthen the period
    (math.nan, 2.0, 32, 1, 32),  # a bad loss keeps the first period
    (1.0, 0.0, 32, 1, 32),       # so does a first loss of zero
])
def test_adacomm_period_shrinks_with_the_square_root_of_the_loss(loss, initial, tau0,
                                                                 minimum, expected):
    assert adacomm_period(loss, initial, tau0, minimum) == expected


def _rounds(trigger, losses, last=60):
    """Steps at which `trigger` holds a round, learning the next loss at each."""
    held, losses = [], iter(losses)
    for step in range(1, last + 1):
        if trigger.due(range(step, step + 1)):
            trigger.learn(next(losses))
            trigger.held(step)
            held.append((step, trigger.n_sync))
    return held


def test_the_first_loss_is_f0_and_each_round_sets_the_next_period():
    trigger = AdaptivePeriod(16, minimum=2, warm_start_steps=4)
    # F0 = 4: then a quarter (period 8), a sixteenth (4), then tiny (the minimum, 2).
    assert _rounds(trigger, [4.0, 1.0, 0.25, 0.0001, 0.0001, 0.0001], last=40) == [
        (20, 16), (36, 8)]
    trigger = AdaptivePeriod(8, minimum=2)
    assert _rounds(trigger, [4.0, 1.0, 0.25, 0.0001, 0.0001], last=22) == [
        (8, 8), (16, 4), (20, 2), (22, 2)]


def test_a_round_falls_due_within_an_execution_of_several_steps():
    trigger = AdaptivePeriod(5)
    assert not trigger.due(range(1, 5)) and trigger.due(range(5, 9))


def test_the_loss_since_a_round_comes_from_kerass_running_means():
    losses = LossSinceRound()
    # Minibatch losses 4, 2, 3 | 1, 5 (new epoch), as running means.
    for batch, mean in enumerate([4.0, 3.0, 3.0]):
        losses.observe(batch, mean)
    assert losses.take() == pytest.approx((9.0, 3))
    losses.begin_epoch()
    losses.observe(1, 3.0)  # an execution of two steps: one call for both
    assert losses.take() == pytest.approx((6.0, 2))
    assert losses.take() == (0.0, 0)


@pytest.mark.parametrize("value, expected", [
    (100, 100), ("100", 100), ("auto", AutoPeriod()), ("AUTO:48", AutoPeriod(48, 2)),
    ("auto:1", AutoPeriod(1, 1)),
])
def test_n_sync_takes_a_number_or_auto(value, expected):
    assert parse_period(value) == expected
    assert AutoPeriod().initial == AUTO_INITIAL_PERIOD


@pytest.mark.parametrize("value, workers, steps", [
    ("40/workers", 1, 40), ("40/workers", 2, 20), ("40/Workers", 3, 14), ("40/workers", 4, 10),
    ("40 / workers", 8, 5), ("40/workers", 16, 3), ("40/worker", 64, 1), ("7/workers", 2, 4),
])
def test_a_period_per_worker_comes_to_the_ceiling_of_n_over_workers(value, workers, steps):
    assert parse_period(value) == PerWorkerPeriod(int(value.split("/")[0]))
    assert resolve_period(value, workers, 1) == steps
    assert resolve_period(12, workers, 1) == 12
    assert resolve_period("auto", workers, 1) == AutoPeriod()


@pytest.mark.parametrize("workers, steps", [(2, 20), (8, 5), (16, 5), (32, 5)])
def test_a_floor_after_the_colon_keeps_a_period_per_worker_from_shrinking_below_it(workers, steps):
    assert parse_period("40/workers:5") == PerWorkerPeriod(40, "workers", 5)
    assert resolve_period("40/workers:5", workers, 1) == steps


def test_local_runs_default_to_int8_rounds_every_2_steps_and_async_to_ten_over_the_workers():
    from hvdtrain.plan import Job, settle

    def settled(cfg, workers):
        return settle(cfg, Job(workers)).config

    local = load_config(None, {"mode": "local"}).resolved()
    # Both once auto has chosen: LAMB's rescaled rounds go every step, in int4.
    assert (local.n_sync, local.round_compression) == (None, None)
    assert (settled(local, 8).n_sync, settled(local, 8).round_compression) == (2, "int8")
    assert (settled(local, 16).n_sync, settled(local, 16).round_compression) == (1, "int4")
    async_ = load_config(None, {"mode": "async"}).resolved()
    # Async's compression waits for the job's period: float32, int8 where it is one step.
    assert (async_.n_sync, async_.round_compression) == ("10/workers", None)
    assert (settled(async_, 8).round_compression, settled(async_, 16).round_compression) == \
        ("none", "int8")
    hierarchy = load_config(None, {"mode": "local", "hierarchical_sgd": True}).resolved()
    assert (hierarchy.n_sync, hierarchy.round_compression) == (2, None)
    assert settled(hierarchy, 8).round_compression == "int8"  # not rescaled: int8
    sync = load_config(None, {"mode": "sync"})
    assert sync.n_sync is None  # unused: nothing to resolve
    assert sync.resolved().round_compression == "none"  # as sync runs always saved it
    given = load_config(None, {"mode": "async", "n_sync": "80/workers"})
    assert given.resolved().n_sync == "80/workers" and given.resolved().resolved() == given.resolved()


@pytest.mark.parametrize("overrides, averages", [
    (dict(mode="local"), False), (dict(mode="async"), False),
    (dict(mode="async", average_optimizer_state=True), True),
    (dict(mode="local", average_optimizer_state=True), True),
])
def test_momentum_is_kept_by_each_worker_unless_asked_for(overrides, averages):
    cfg = load_config(None, overrides)
    assert cfg.resolved().average_optimizer_state is averages
    assert cfg.resolved().resolved() == cfg.resolved()


def test_a_bad_average_optimizer_state_is_named_in_one_line():
    with pytest.raises(ConfigError, match="--average-optimizer-state must be true or false, "
                                          "got 'often'"):
        load_config(None, {"mode": "local", "average_optimizer_state": "often"})


@pytest.mark.parametrize("value", [0, "0", -3, 2.5, "often", "auto:0", "auto:", True,
                                   "0/workers", "0/hosts", "40/racks", "/workers",
                                   "40/workers:0", "40/workers:", "40/workers:x"])
def test_a_bad_n_sync_is_named_in_one_line(value):
    with pytest.raises(ConfigError, match="--n-sync must be a positive integer, got"):
        load_config(None, {"mode": "local", "n_sync": value})


def test_the_cli_passes_auto_and_numbers_through():
    from hvdtrain.cli import build_parser

    args = build_parser().parse_args(["train", "--mode", "local", "--n-sync", "auto"])
    assert load_config(None, {"mode": args.mode, "n_sync": args.n_sync}).n_sync == "auto"
    args = build_parser().parse_args(["train", "--n-sync", "7"])
    assert args.n_sync == 7


def test_local_sgd_takes_auto_and_names_a_bad_period():
    from hvdtrain.keras.local_sgd import LocalSGD

    callback = LocalSGD(n_sync="auto:12", warm_start_steps=3)
    assert callback.period == 12 and callback.trigger.next_round == 15
    with pytest.raises(ValueError, match="n_sync must be a positive integer"):
        LocalSGD(n_sync=0)
    with pytest.raises(ValueError, match=r"^LocalSGD\(n_sync='auto'\) adapts a period of steps; "
                                         r"sync_seconds=2.0 sets rounds by time instead"):
        LocalSGD(n_sync="auto", sync_seconds=2.0, batch_size=4, epoch_examples=10)


def test_local_sgd_resolves_a_period_per_worker_for_its_workers():
    from hvdtrain import comm
    from hvdtrain.keras.local_sgd import LocalSGD

    comm.init()  # a world of one worker outside horovodrun
    assert LocalSGD(n_sync="40/workers").period == 40
    assert LocalSGD(n_sync="40/workers").trigger.due(range(40, 41))


F32 = dict(round_compression="none")


@pytest.mark.parametrize("overrides, workers, warns", [
    (dict(mode="local"), 8, False),                    # int8 every 2 steps: an eighth
    (dict(mode="local"), 64, False),
    (dict(F32, mode="local", n_sync="40/workers", average_optimizer_state=True), 20, True),  # 2 steps
    (dict(mode="local", n_sync="40/workers", average_optimizer_state=True), 20, False),  # int8
    (dict(F32, mode="local", n_sync="40/workers"), 20, False),  # 2 steps of the weights alone
    (dict(F32, mode="local", n_sync="40/workers"), 40, True),   # 1 step: the weights every step
    (dict(mode="local", round_compression="fp16", n_sync=1), 4, False),  # half of sync's
    (dict(F32, mode="local", fp16_allreduce=True, n_sync=1), 4, True),  # fp16 rounds, fp16 gradients
    (dict(mode="async", n_sync=2, momentum=0.0), 4, False),  # no slots: half of sync's bytes
    (dict(F32, mode="local", n_sync=3, optimizer="adam", average_optimizer_state=True), 4, True),  # weights and two moments
    (dict(F32, mode="local", n_sync=3, optimizer="lamb", average_optimizer_state=True), 4, True),  # Lamb's two moments too
    (dict(F32, mode="local", n_sync=3, optimizer="lars", average_optimizer_state=True), 4, False),  # LARS's momentum only
    # int8 rounds send Lamb's running squares in float32: 2 + 4 bytes a value, 1.5 steps' worth
    (dict(mode="local", n_sync=1, optimizer="lamb", average_optimizer_state=True), 4, True),
    (dict(mode="local", n_sync=2, optimizer="lamb", average_optimizer_state=True), 4, False),
    (dict(F32, mode="local", n_sync=1), 4, True),
    (dict(mode="local", n_sync=1), 4, False),          # int8 every step: a quarter of sync's
    (dict(F32, mode="local", n_sync=1), 1, False),     # one worker sends nothing
    (dict(mode="async"), 8, False),                    # 2 steps, no momentum averaged
    (dict(mode="async"), 10, False),                   # 1 step, in int8: a quarter
    (dict(mode="async", round_compression="none"), 10, True),  # float32 every step
    (dict(mode="sync"), 64, False),
    (dict(mode="local", n_sync="auto"), 64, False),
])
def test_rank_0_warns_when_local_rounds_would_move_as_many_bytes_as_sync(overrides, workers,
                                                                           warns):
    from hvdtrain.plan import Job, costly_period, settle

    job = Job(workers, 1)
    plan = settle(load_config(None, overrides), job)
    warning = costly_period(plan.config, job)
    assert (warning is not None) == warns and (warning in plan.warnings or not warns)
    if warns:
        assert warning.startswith("--n-sync") and "\n" not in warning


def test_rounds_every_t_seconds_keep_no_step_period_beside_a_default_per_worker():
    from hvdtrain import comm
    from hvdtrain.keras.local_sgd import LocalSGD

    comm.init()
    timed = LocalSGD(n_sync="40/workers", sync_seconds=2.0, batch_size=4, epoch_examples=40)
    assert timed.per_worker is None and timed.period is None


def test_a_checkpoint_keeps_the_adaptive_schedule_and_a_new_callback_goes_on_with_it(tmp_path):
    """F0, the period in force and the next round travel with the model (checkpoints,
    elastic commits, rank 0's broadcast), so a resumed run does not start again from τ0."""
    import keras
    import numpy as np
    import tensorflow as tf

    from hvdtrain import comm
    from hvdtrain.keras.local_sgd import LocalSGD

    comm.init()

    def model():
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        net.compile(keras.optimizers.SGD(0.05), "mse")
        return net

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    first, trained = LocalSGD(n_sync="auto:8"), model()
    trained.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[first])  # 32 steps
    learnt = first.trigger.saved()
    assert not math.isnan(learnt[0]) and learnt[2] > 32  # F0 known, the next round ahead
    path = tf.train.Checkpoint(model=trained, **first.kept_state).write(str(tmp_path / "ckpt"))

    second, resumed = LocalSGD(n_sync="auto:8"), model()
    second.attach(resumed)
    tf.train.Checkpoint(model=resumed, **second.kept_state).read(path).expect_partial()
    assert second.trigger.saved() != learnt  # still τ0's until training starts
    at_start = []
    seen = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: at_start.append(second.trigger.saved()))
    resumed.fit(x[:2], y[:2], batch_size=2, epochs=1, verbose=0, callbacks=[second, seen])
    assert at_start == [learnt]
