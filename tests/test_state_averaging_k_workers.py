"""ModelStateAverager's rounds at K = 2, 3 and 4 workers, in one process (tests/fake_comm.py).

Each test builds every worker's model; the other workers' sends come from running the same
code as them (`settled_sends`), and one rank's round is checked against numpy. The horovodrun
suite (test_state_averaging.py) runs the same rounds over real collectives.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from fake_comm import FakeComm, sent_by, settled_sends
from hvdtrain.keras.callbacks import AverageModelStatistics
from hvdtrain.keras.state import (ModelStateAverager, OuterOptimizer, build_optimizer,
                                  current_learning_rate, optimizer_slots, read)
from workers import state_averaging_worker
from workers.state_averaging_worker import INNER_LR, set_statistics

F32 = np.float32


def batch_norm_model() -> keras.Model:
    """The horovodrun suite's model: BatchNorm inside a Sequential inside a functional
    model, with momentum slots; every worker starts from the same weights."""
    keras.utils.set_random_seed(0)
    return state_averaging_worker.batch_norm_model()


def vector_model(values) -> keras.Model:
    """One trainable weight: a (1, n) kernel holding `values`."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(len(values), use_bias=False)])
    model.compile(keras.optimizers.SGD(INNER_LR), "mse")
    build_optimizer(model)
    model.trainable_variables[0].assign([values])
    return model


def batch_norm(model):
    return model.layers[1].layers[-1]


def worker_data(workers: int) -> list[np.ndarray]:
    """Each worker's activations (40 samples, 3 channels), centred in different places."""
    rng = np.random.default_rng(workers)
    return [rng.normal([k, -2.0 * k, 0.5], [1.0 + k, 0.5, 2.0], size=(40, 3))
            for k in range(workers)]


def weights(model) -> list[np.ndarray]:
    return [w.numpy().astype(np.float64) for w in model.trainable_variables]


def distance(own, mean) -> float:
    return float(np.sqrt(sum(np.sum((w - m) ** 2) for w, m in zip(own, mean))))


def sends(averagers, rank, take_chief=False) -> dict:
    """What every worker but `rank` hands to its round: the same code, run as that worker
    (keeping no residual, so that running it again sends the same)."""
    def run(k):
        a = averagers[k]
        return lambda: a.exchange(read(a.variables), take_chief, feedback=False)
    sent = settled_sends(len(averagers), run)
    return {k: by_name for k, by_name in sent.items() if k != rank}


def compressed_round(world) -> bool:
    """Whether this worker's round went as a compressed round: an alltoall, then an allgather."""
    return [call.kind for call in world.calls[:2]] == ["alltoall", "allgather"]


def round_at(rank, averagers, distances=None, before=None, **average_options):
    """Rank `rank`'s `average()` in a world whose other workers send what theirs do and
    report `distances` (by rank) from the mean; `before(world)` holds any other sends.
    Returns (its world, the distance it gives)."""
    sent = sends(averagers, rank, average_options.get("take_chief", False))
    world = FakeComm(len(averagers), rank)
    with world:
        world.hold_sent(sent)
        if before is not None:
            before(world)
        if distances is not None:
            # Each worker reports its distance and its inner rate (the outer step takes the
            # workers' mean rate): here every worker's rate is this one's.
            rate = float(current_learning_rate(averagers[rank].model.optimizer))
            world.hold("weight_divergence",
                       {k: [np.array([distances[k], rate])] for k in world.others})
        returned = averagers[rank].average(**average_options)
    return world, returned


@pytest.mark.parametrize("workers, rank", [(2, 1), (3, 0), (4, 3)])
def test_k_workers_batchnorm_variance_pools_all_their_data_and_weights_take_the_mean(
        workers, rank):
    data = worker_data(workers)
    models = [batch_norm_model() for _ in range(workers)]
    for k, model in enumerate(models):
        set_statistics(model, data[k].mean(0), data[k].var(0))
        for w in model.trainable_variables:
            w.assign(w + 0.1 * (k + 1))
    held = [weights(m) for m in models]
    mean_weights = [np.mean(ws, axis=0) for ws in zip(*held)]
    distances = [distance(ws, mean_weights) for ws in held]
    averagers = [ModelStateAverager(m) for m in models]
    _, returned = round_at(rank, averagers, distances)
    everything = np.concatenate(data)
    np.testing.assert_allclose(batch_norm(models[rank]).moving_mean, everything.mean(0),
                               rtol=1e-5, atol=1e-6)
    pooled = batch_norm(models[rank]).moving_variance.numpy()
    np.testing.assert_allclose(pooled, everything.var(0), rtol=1e-5)
    # Averaging the variances instead would miss the spread of the workers' means.
    assert pooled[0] - np.mean([d.var(0)[0] for d in data]) > 0.2
    for w, m in zip(weights(models[rank]), mean_weights):
        np.testing.assert_allclose(w, m, rtol=1e-6)
    assert returned == pytest.approx(np.mean(distances), rel=1e-5)


@pytest.mark.parametrize("workers, rank", [(2, 0), (4, 2)])
def test_sync_modes_statistics_callback_pools_batchnorm_variance_over_k_workers(workers, rank):
    data = worker_data(workers)
    models = [batch_norm_model() for _ in range(workers)]
    for k, model in enumerate(models):
        set_statistics(model, data[k].mean(0), data[k].var(0))
    averagers = [AverageModelStatistics().attach(m) for m in models]
    world, _ = round_at(rank, averagers)
    assert [call.name for call in world.calls] == ["model_state"]  # no weights, no distance
    np.testing.assert_allclose(batch_norm(models[rank]).moving_variance,
                               np.concatenate(data).var(0), rtol=1e-5)


@pytest.mark.parametrize("workers, rank", [(3, 1), (4, 0)])
def test_fp16_rounds_at_k_workers_pool_batchnorm_variance_from_the_changes(workers, rank):
    base_mean, base_variance = np.array([10.0, -4.0, 0.5]), np.array([2.0, 0.1, 1.0])
    rng = np.random.default_rng(1)
    mean_steps = rng.uniform(-0.01, 0.01, size=(workers, 3))
    variance_steps = rng.uniform(-0.05, 0.05, size=(workers, 3))
    models = [batch_norm_model() for _ in range(workers)]
    averagers = []
    for k, model in enumerate(models):
        set_statistics(model, base_mean, base_variance)
        averagers.append(ModelStateAverager(model, optimizer_state=True, compression="fp16"))
        averagers[-1].reset_anchor()  # the consensus every worker holds
        set_statistics(model, base_mean + mean_steps[k], base_variance + variance_steps[k])
    held_means = [F32(base_mean + s).astype(np.float64) for s in mean_steps]
    held_variances = [F32(base_variance + s).astype(np.float64) for s in variance_steps]
    world, _ = round_at(rank, averagers, distances=[0.0] * workers)
    assert compressed_round(world)
    expected_mean = np.mean(held_means, axis=0)
    expected_variance = np.mean([v + m ** 2 for v, m in zip(held_variances, held_means)],
                                axis=0) - expected_mean ** 2
    # float16 precision of the changes (at most 0.05), plus float32 rounding: far below
    # float16's own 2^-7 at a mean of 10.
    tolerance = 0.05 * 2.0 ** -9 + 2.0 ** -23 * (np.abs(expected_mean) + expected_variance)
    bn = batch_norm(models[rank])
    assert (np.abs(bn.moving_mean.numpy() - expected_mean) <= tolerance).all()
    assert (np.abs(bn.moving_variance.numpy() - expected_variance) <= tolerance).all()


STEP = 1e-4


@pytest.mark.parametrize("workers, rank", [(2, 0), (4, 3)])
def test_fp16_rounds_send_the_change_so_k_workers_small_updates_survive_two_rounds(
        workers, rank):
    assert F32(np.float16(1.0 + STEP)) == 1.0  # compressing the weight itself loses it
    moves = [np.array([STEP, 0.0, 3 * STEP, -STEP])[:workers],
             np.array([0.0, 2 * STEP, STEP, STEP])[:workers]]
    models = [vector_model([1.0]) for _ in range(workers)]
    averagers = [ModelStateAverager(m, compression="fp16") for m in models]
    consensus = 1.0
    for round_moves in moves:
        for k, (model, averager) in enumerate(zip(models, averagers)):
            if k != rank:  # every other worker holds the last round's consensus as reference
                model.trainable_variables[0].assign([[consensus]])
                averager.reset_anchor()
            model.trainable_variables[0].assign([[consensus + round_moves[k]]])
        held = [float(F32(consensus + m)) for m in round_moves]
        world, _ = round_at(rank, averagers, distances=[0.0] * workers)
        # This worker sent its change from the consensus, in float16 (with what its last
        # round's encoding cut off, at most 2^-11 of that round's change).
        assert compressed_round(world)
        (sent,) = world.sent("model_state_scatter")  # one row per shard
        assert sent.dtype == np.float16
        assert float(sent[0, 0]) == pytest.approx(round_moves[rank], abs=6 * STEP * 2.0 ** -11)
        got = float(models[rank].trainable_variables[0].numpy()[0, 0])
        assert abs(got - np.mean(held)) <= 3 * STEP * 2.0 ** -10 + 2.0 ** -23
        consensus = got
    assert consensus - 1.0 > 0.9 * np.mean(moves[0] + moves[1])


def rule(x0, u, mean, nesterov, lr, momentum):
    """SlowMo (Wang et al. 2020) and Nesterov (DiLoCo) outer steps, written out for the test."""
    gradient = (x0 - mean) / INNER_LR
    u = momentum * u + gradient
    direction = momentum * u + gradient if nesterov else u
    return x0 - lr * INNER_LR * direction, u


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("workers, rank", [(2, 1), (3, 0)])
def test_outer_steps_at_k_workers_follow_slowmo_and_nesterov_over_three_rounds(
        workers, rank, nesterov):
    lr, momentum = 0.7, 0.5
    start = np.array([1.0, -2.0, 0.5])
    moves = np.random.default_rng(3).normal(0, 0.01, size=(3, workers, 3))
    models = [vector_model(start) for _ in range(workers)]
    outer = OuterOptimizer(lr, momentum, nesterov)
    averagers = [ModelStateAverager(m, outer=outer) for m in models]
    averagers[rank].reset_anchor()
    x0, u = start.copy(), np.zeros(3)
    for round_moves in moves:
        for k, model in enumerate(models):  # every worker steps from the last round's x0
            model.trainable_variables[0].assign([F32(x0 + round_moves[k])])
        mean = np.mean([F32(x0 + m) for m in round_moves], axis=0)
        x0, u = rule(x0, u, mean, nesterov, lr, momentum)
        round_at(rank, averagers, distances=[0.0] * workers, apply_outer=True)
        np.testing.assert_allclose(models[rank].trainable_variables[0].numpy()[0], x0,
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(averagers[rank].anchor[0].numpy()[0], x0, rtol=0, atol=1e-5)
    # Far from where three plain averages would have left the weights.
    plain = start + moves.mean(axis=1).sum(axis=0)
    assert np.abs(x0 - plain).max() > 100 * 1e-5


@pytest.mark.parametrize("fp16", [False, True])  # fp16: a compressed round
@pytest.mark.parametrize("workers, rank", [(3, 0), (3, 2), (2, 1)])
def test_take_chief_gives_every_one_of_k_workers_rank_0s_state_not_the_mean(
        workers, rank, fp16):
    # With fp16 the workers depart a little from a state they all held (mean 0, variance
    # 1, the reference); without it, far.
    scale = 0.01 if fp16 else 1.0
    data = worker_data(workers)
    models = [batch_norm_model() for _ in range(workers)]
    averagers = []
    for k, model in enumerate(models):
        averagers.append(ModelStateAverager(model, compression="fp16" if fp16 else "none"))
        averagers[-1].reset_anchor()
        set_statistics(model, scale * data[k].mean(0), 1 + scale * (data[k].var(0) - 1))
        for w in model.trainable_variables:
            w.assign(w + scale * 0.1 * (k + 1))
    chief = [v.numpy().copy() for v in averagers[0].variables]
    change = max(np.abs(c - r.numpy()).max() for c, r in zip(chief, averagers[0].reference)
                 ) if fp16 else 0.0
    distances = [distance(weights(m), weights(models[0])) for m in models]
    world, returned = round_at(rank, averagers, distances, take_chief=True)
    # A sum in which the others put zeros: rank 0's state exactly, variances unpooled.
    sent = world.sent("model_state_from_chief" + ("_scatter" if fp16 else ""))
    assert all(not s.any() for s in sent) == (rank != 0)
    for variable, expected in zip(averagers[rank].variables, chief):
        if fp16:  # rank 0's change since the reference, in float16
            np.testing.assert_allclose(variable.numpy(), expected, rtol=2.0 ** -22,
                                       atol=change * 2.0 ** -10)
        else:
            np.testing.assert_array_equal(variable.numpy(), expected)
    assert returned == pytest.approx(np.mean(distances), rel=1e-3 if fp16 else 1e-5)


@pytest.mark.parametrize("take_chief", [False, True])
def test_fp16_rounds_at_three_workers_keep_adams_running_squares_non_negative(take_chief):
    # Reference 5.5e-8, every worker at 2e-8: the change rounds in float16 to -6e-8, and the
    # reference plus it is -4.6e-9 unless the round floors it; Adam's sqrt(v) is then NaN.
    averagers = []
    for _ in range(3):
        model = vector_model([1.0])
        model.compile(keras.optimizers.Adam(INNER_LR), "mse")
        build_optimizer(model)
        averagers.append(ModelStateAverager(model, optimizer_state=True, compression="fp16"))
        for slot in optimizer_slots(model.optimizer):
            slot.assign(tf.fill(slot.shape, 5.5e-8))
        averagers[-1].reset_anchor()
        for slot in optimizer_slots(model.optimizer):
            slot.assign(tf.fill(slot.shape, 2e-8))
    round_at(1, averagers, distances=[0.0] * 3, take_chief=take_chief)
    squares = [averagers[1].variables[j].numpy() for j in averagers[1].non_negative_positions]
    assert squares and all((s >= 0).all() for s in squares)


def test_show_mean_lends_three_workers_mean_without_moving_slowmos_anchor():
    models = [vector_model([float(k), 2.0 * k]) for k in range(3)]
    averagers = [ModelStateAverager(m, outer=OuterOptimizer(0.7, 0.5)) for m in models]
    averagers[2].reset_anchor()
    anchor = averagers[2].anchor[0].numpy().copy()
    others = {k: sent_by(k, 3, a.show_mean) for k, a in enumerate(averagers[:2])}
    with FakeComm(3, 2) as world:
        world.hold_sent(others)
        own = averagers[2].show_mean()
    np.testing.assert_allclose(models[2].trainable_variables[0].numpy(), [[1.0, 2.0]])
    np.testing.assert_array_equal(own[0].numpy(), [[2.0, 4.0]])  # to put back later
    np.testing.assert_array_equal(averagers[2].anchor[0].numpy(), anchor)
