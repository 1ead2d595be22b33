"""`LocalSGD` inside a real `model.fit`, K workers in threads of one process
(tests/threaded_comm.py): the rules across workers that the horovodrun suites prove on
real collectives, here at K = 2 to 4 in seconds."""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest

import hvdtrain.keras as hk
from hvdtrain import comm
from threaded_comm import run_workers

STEPS = 8          # steps of one epoch
BATCH = 4          # examples a worker takes a step
# Keras's seeds are global: threads build their models one at a time, each from the seed.
BUILDING = threading.Lock()


class WeightsAfterEachStep(keras.callbacks.Callback):
    """Every weight after each step (placed after LocalSGD: after the step's round), and
    at the epoch's end (after its round)."""

    def __init__(self):
        super().__init__()
        self.weights: list[np.ndarray] = []
        self.at_epoch_end: list[np.ndarray] = []

    def _now(self) -> np.ndarray:
        return np.concatenate([w.numpy().ravel() for w in self.model.weights])

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(self._now())

    def on_epoch_end(self, epoch, logs=None):
        self.at_epoch_end.append(self._now())


def _data(rank: int, workers: int):
    """This worker's shard of one learnable dataset (its own examples)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH * workers, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    return x[rank::workers], y[rank::workers]


def _model(optimizer=None) -> keras.Model:
    with BUILDING:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
    model.compile(hk.with_gradient_averaging(optimizer or keras.optimizers.SGD(0.1),
                                             averaging=False),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit_local(workers: int, **local_options):
    """Each worker's weights after every step of one epoch of local SGD."""
    def work(rank):
        model = _model()
        x, y = _data(comm.rank(), comm.size())
        seen = WeightsAfterEachStep()
        local = hk.LocalSGD(**local_options)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[local, seen])
        return np.stack(seen.weights + seen.at_epoch_end), local.rounds
    return run_workers(workers, work)


@pytest.mark.parametrize("workers, compression",
                         [(2, "none"), (3, "int8"), (4, "int4"), (2, "int2"), (3, "int1"),
                          (3, "topk")])
def test_every_worker_holds_the_same_bits_right_after_each_round_and_not_between(
        workers, compression):
    results = _fit_local(workers, n_sync=3, round_compression=compression)
    weights = [w for w, _ in results]
    assert {rounds for _, rounds in results} == {3}  # after steps 3, 6 and the epoch's end
    for step in range(STEPS + 1):  # and at the epoch's end, after its round
        same = all(np.array_equal(weights[0][step], w[step]) for w in weights[1:])
        assert same == (step + 1 in (3, 6, STEPS + 1)), f"after step {step + 1}"


def test_a_round_merged_a_step_after_it_starts_adds_its_mean_less_the_snapshot_then():
    # Streaming DiLoCo's tau: the round that starts after step 3 is taken after step 4,
    # not when the next starts after step 6. Step 4 trains from the same state either way.
    workers = 2
    late = [w for w, _ in _fit_local(workers, n_sync=3, overlap=True)]
    merged = [w for w, _ in _fit_local(workers, n_sync=3, overlap=True, merge_after=1)]
    mean = np.mean([w[2] for w in late], axis=0)  # the snapshots, after step 3
    for rank in range(workers):
        np.testing.assert_array_equal(merged[rank][:3], late[rank][:3])
        np.testing.assert_allclose(merged[rank][3], late[rank][3] + mean - late[rank][2],
                                   rtol=1e-6, atol=1e-7)
        assert not np.allclose(merged[rank][3], late[rank][3])


def test_rounds_every_step_of_plain_sgd_are_large_batch_sgd():
    workers = 3
    results = _fit_local(workers, n_sync=1)
    # One model on the whole global batch each step, with the same rate: the mean of the
    # workers' gradients is the large batch's gradient.
    comm.init()  # a world of one worker: this process
    model = _model()
    # Reorder into global batches made of each worker's local batch in rank order.
    shards = [_data(r, workers) for r in range(workers)]
    xs = np.concatenate([np.concatenate([s[0][i * BATCH:(i + 1) * BATCH] for s in shards])
                         for i in range(STEPS)])
    ys = np.concatenate([np.concatenate([s[1][i * BATCH:(i + 1) * BATCH] for s in shards])
                         for i in range(STEPS)])
    seen = WeightsAfterEachStep()
    model.fit(xs, ys, batch_size=BATCH * workers, epochs=1, shuffle=False, verbose=0,
              callbacks=[seen])
    for step in range(STEPS):
        for worker in range(workers):
            np.testing.assert_array_equal(results[worker][0][step], results[0][0][step])
        np.testing.assert_allclose(results[0][0][step], seen.weights[step], rtol=1e-5,
                                   atol=1e-6, err_msg=f"after step {step + 1}")


@pytest.mark.long  # 17 seconds here
def test_async_rounds_by_the_quadratic_rule_meet_when_workers_skip_different_steps():
    """A LossScaleOptimizer does not count a step whose gradients overflowed, and each
    worker overflows on its own data: the workers' optimizers count different steps. The
    period each sets from the rate must still be the job's, or their overlapped rounds
    part and an epoch end deadlocks."""
    from hvdtrain.keras.state import base_optimizer

    class SkipsSteps(keras.callbacks.Callback):  # before LocalSGD, as an overflow would
        def __init__(self, skipped):
            super().__init__()
            self.skipped = skipped

        def on_train_batch_end(self, batch, logs=None):
            if self.skipped(batch):
                base_optimizer(self.model.optimizer).iterations.assign_sub(1)

    def work(rank):
        rates = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=2 * 4 * STEPS)
        model = _model(keras.optimizers.SGD(rates))
        x, y = _data(comm.rank(), comm.size())
        local = hk.LocalSGD(n_sync="qsr:1", overlap=True)
        # Rank 0 overflows every third step, rank 1 never: their counts part ever more.
        skips = SkipsSteps((lambda batch: batch % 3 == 0) if rank == 0 else (lambda batch: False))
        model.fit(np.tile(x, (4, 1)), np.tile(y, 4), batch_size=1, epochs=2, shuffle=False,
                  verbose=0, callbacks=[skips, local])
        return local.trigger.saved(), local.rounds

    first, second = run_workers(2, work, wait=30)
    assert first == second


def test_hierarchical_rounds_give_every_worker_the_mean_of_all_workers_statistics():
    """4 workers on 2 hosts of 2: a host's workers average gradients every step, so they
    hold one set of weights, but each updates BatchNorm's moving statistics from its own
    batches. A round across hosts, cut in host shards, must still leave every worker the
    mean of all four workers' statistics."""
    class Statistics(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.means: list[np.ndarray] = []

        def on_train_batch_end(self, batch, logs=None):
            layer = next(l for l in self.model.layers if "batch_norm" in l.name)
            self.means.append(layer.moving_mean.numpy().copy())

    def work(rank):
        with BUILDING:
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8),
                                      keras.layers.BatchNormalization(), keras.layers.Dense(2)])
        model.compile(hk.with_gradient_averaging(keras.optimizers.SGD(0.1), within_host=True),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = _data(comm.rank(), comm.size())
        before, after = Statistics(), Statistics()
        local = hk.LocalSGD(n_sync=2, hierarchical=True, round_compression="none")
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[before, local, after])
        return np.stack(before.means), np.stack(after.means)

    results = run_workers(4, work, hosts=[(0, 1), (2, 3)])
    for step in (1, 3, 5):  # the rounds after steps 2, 4 and 6
        mean_before = np.mean([before[step] for before, _ in results], axis=0)
        for rank, (_, after) in enumerate(results):
            np.testing.assert_allclose(after[step], mean_before, rtol=1e-5, atol=1e-6,
                                       err_msg=f"rank {rank} after step {step + 1}")


class RoundsAfterEachStep(keras.callbacks.Callback):
    """Whether the period's round came after each step, and the period in force then
    (placed after LocalSGD)."""

    def __init__(self, local):
        super().__init__()
        self.local = local
        self.held: list[bool] = []
        self.periods: list[int] = []
        self._before = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._before = self.local.rounds

    def on_train_batch_end(self, batch, logs=None):
        self.held.append(self.local.rounds > self._before)
        self.periods.append(self.local.period)


def _fit_link(workers: int, clock=None, slower_rank: int | None = None, epochs: int = 2,
              **local_options):
    """Each worker's weights, rounds and periods after every step of `epochs` epochs of 16
    steps of local SGD whose period follows the link (`n_sync="link"`)."""
    import time

    class SlowerSteps(keras.callbacks.Callback):  # before LocalSGD: part of the step's time
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.02)

    def work(rank):
        model = _model()
        x, y = _data(comm.rank(), comm.size())
        local = hk.LocalSGD(n_sync="link", **local_options,
                            **({"clock": clock()} if clock else {}))
        seen, counted = WeightsAfterEachStep(), RoundsAfterEachStep(local)
        slower = [SlowerSteps()] if rank == slower_rank else []
        model.fit(np.tile(x, (2, 1)), np.tile(y, 2), batch_size=BATCH, epochs=epochs, shuffle=False,
                  verbose=0, callbacks=[*slower, local, seen, counted])
        return np.stack(seen.weights), counted.held, counted.periods, local.trigger.saved()
    return run_workers(workers, work)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_link_period_is_every_workers_though_each_times_its_own_steps(overlap):
    """Rank 1's steps are 20 ms slower and every worker times its own rounds, yet the summed
    report sets the same period on every worker at the same round: their rounds meet, and
    after each blocking one every worker holds the same weights."""
    results = _fit_link(3, slower_rank=1, overlap=overlap, round_compression="none")
    weights, held, periods, saved = zip(*results)
    assert all(h == held[0] for h in held) and all(p == periods[0] for p in periods)
    assert len(set(saved)) == 1 and sum(held[0]) >= 4
    if not overlap:
        for step in np.flatnonzero(held[0]):
            assert all(np.array_equal(weights[0][step], w[step]) for w in weights[1:]), step


@pytest.mark.parametrize("tick, period", [(100.0, 1), (1e-9, 8)])
def test_the_link_period_shortens_when_steps_dwarf_rounds_and_stops_at_its_longest(tick, period):
    """Each worker's clock moves `tick` seconds a reading, so a step takes `tick` to it: far
    longer than any round (rounds every step), or far shorter (the longest period, 8)."""
    import itertools

    results = _fit_link(2, clock=lambda: itertools.count(step=tick).__next__, epochs=1)
    _, _, periods, _ = zip(*results)
    assert periods[0][:3] == [2, 2, 2]   # from 2 until the second round has been timed
    assert periods[0][-1] == periods[1][-1] == period
