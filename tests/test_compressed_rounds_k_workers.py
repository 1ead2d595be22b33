"""Compressed rounds (float16, int8 with error feedback) at K = 2, 3 and 4 workers, in one
process (tests/fake_comm.py): every worker's round is run, with the other workers' sends
to each collective coming from the same code run as them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from fake_comm import ECHO, FakeComm, sent_by, settled_sends
from hvdtrain.rounds import quantize
from hvdtrain.keras.compressed_rounds import CompressedExchange
from hvdtrain.keras.state import ModelStateAverager, build_optimizer, optimizer_slots, read
from test_state_averaging_k_workers import batch_norm_model, vector_model
from workers.state_averaging_worker import set_statistics

SHAPES = [(3, 700), (50,), (2, 2)]  # 2,154 values: three chunks, padded to whole shards
NAME = "x"


def worker_values(workers: int, seed: int, scale: float = 1.0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[(rng.normal(size=s) * scale * (1 + k)).astype(np.float32) for s in SHAPES]
            for k in range(workers)]


def run_round(exchanges, values, name=NAME, shares=None, call=None):
    """Every worker's round, in turn: the sends to the alltoall come from each worker's own
    values; those to the allgather from each worker's round given everyone's alltoall sends.
    Returns each worker's result. `call(exchange, values, share, feedback)` runs one
    worker's part (by default `CompressedExchange.mean`)."""
    workers = len(exchanges)
    call = call or (lambda ex, vals, share, feedback: ex.mean(
        [tf.constant(v) for v in vals], name=name, share=share, feedback=feedback))
    share = (lambda r: None) if shares is None else (lambda r: shares[r])

    def as_worker(r, feedback):
        return lambda: call(exchanges[r], values[r], share(r), feedback)

    # The first two passes keep no residual: only the last, real one does.
    scatter = {r: sent_by(r, workers, as_worker(r, False))[f"{name}_scatter"]
               for r in range(workers)}
    gather = {}
    for r in range(workers):
        with FakeComm(workers, r) as world:
            world.hold(f"{name}_scatter", {k: scatter[k] for k in world.others})
            world.hold(f"{name}_gather", ECHO)
            as_worker(r, False)()
            gather[r] = world.sent(f"{name}_gather")
    results = []
    for r in range(workers):
        with FakeComm(workers, r) as world:
            world.hold(f"{name}_scatter", {k: scatter[k] for k in world.others})
            world.hold(f"{name}_gather", {k: gather[k] for k in world.others})
            results.append([np.asarray(t) for t in as_worker(r, True)()])
    return results


def exchanges_for(workers: int, compression: str) -> list[CompressedExchange]:
    like = [tf.zeros(s) for s in SHAPES]
    return [CompressedExchange(like, compression) for _ in range(workers)]


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in arrays]).astype(np.float64)


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("compression", ["int8", "int4", "fp16"])
def test_every_worker_ends_a_compressed_round_with_the_same_bits_near_the_mean(
        workers, compression):
    values = worker_values(workers, seed=workers)
    results = run_round(exchanges_for(workers, compression), values)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    mean = np.mean([flat(v) for v in values], axis=0)
    largest = max(np.abs(flat(v)).max() for v in values)
    # Two encodings, each off by half a step: int8's is 1/254 of a chunk's largest, int4's
    # 1/14.
    half_steps = {"int8": 1 / 254, "int4": 1 / 14, "fp16": 2.0 ** -11}
    bound = 2 * largest * half_steps[compression]
    assert np.abs(flat(results[0]) - mean).max() <= bound
    assert np.abs(flat(results[0]) - mean).max() > 0  # it did compress


@pytest.mark.parametrize("workers, compression", [(2, "int8"), (3, "int8"), (3, "int4")])
def test_error_feedback_carries_each_rounds_cut_into_the_next(workers, compression):
    exchanges = exchanges_for(workers, compression)
    rounds = [worker_values(workers, seed=10 + t, scale=10.0 ** -t) for t in range(3)]
    taken = []
    for t, values in enumerate(rounds):
        before = [ex.residual.numpy().copy() for ex in exchanges]
        taken.append(flat(run_round(exchanges, values)[0]))
        if t == 0:
            assert all(not b.any() for b in before)
        residuals = [ex.residual.numpy().astype(np.float64) for ex in exchanges]
        assert all(r.any() for r in residuals)  # each worker keeps a cut of its own
        # What the workers have taken so far is what they meant, but for what is still
        # kept back: nothing was lost, only delayed (Σ taken = Σ means − mean residual).
        meant = sum(np.mean([flat(v) for v in vals], axis=0) for vals in rounds[:t + 1])
        np.testing.assert_allclose(sum(taken), meant - np.mean(residuals, axis=0),
                                   rtol=0, atol=1e-6 * np.abs(meant).max())
    # The third round's changes are 100 times smaller than the first's: without the first
    # rounds' cuts, the taken sum would miss by up to the first round's step.
    first_step = max(np.abs(flat(v)).max() for v in rounds[0]) / quantize.LEVELS[compression] / 2
    assert np.abs(np.mean(residuals, axis=0)).max() < first_step


def test_a_look_at_the_mean_keeps_no_residual_and_a_reset_drops_it():
    exchanges = exchanges_for(2, "int8")
    run_round(exchanges, worker_values(2, seed=1))
    kept = [ex.residual.numpy().copy() for ex in exchanges]
    look = lambda ex, vals, share, feedback: ex.mean(
        [tf.constant(v) for v in vals], name=NAME, feedback=False)
    run_round(exchanges, worker_values(2, seed=2), call=look)
    for ex, k in zip(exchanges, kept):
        np.testing.assert_array_equal(ex.residual.numpy(), k)
        ex.reset()
        assert not ex.residual.numpy().any()


def test_a_hand_over_from_rank_0_takes_its_values_and_drops_the_others_residuals():
    exchanges = exchanges_for(3, "int8")
    run_round(exchanges, worker_values(3, seed=3))  # every worker now holds a residual
    values = worker_values(3, seed=4)
    chief_meant = flat(values[0]) + exchanges[0].residual.numpy()
    results = run_round(exchanges, values, shares=[1.0, 0.0, 0.0])
    for other in results[1:]:
        np.testing.assert_array_equal(flat(results[0]), flat(other))
    assert np.abs(flat(results[0]) - chief_meant).max() <= 2 * np.abs(chief_meant).max() / 254
    # The others' own cuts are gone; what they keep is only their shards' cut of the sum.
    width = quantize.padded_length(chief_meant.size, 3, "int8") // 3
    for r in (1, 2):
        outside = np.delete(exchanges[r].residual.numpy(), np.s_[r * width:(r + 1) * width])
        assert not outside.any()


@pytest.mark.parametrize("workers, compression", [(2, "int4"), (4, "int4"), (4, "int8")])
def test_a_hand_over_followed_by_rounds_in_which_nobody_moves_converges_to_rank_0s_state(
        workers, compression):
    # A hand-over's cut is owed in full: mean rounds of zero changes deliver all of it.
    exchanges = exchanges_for(workers, compression)
    values = worker_values(workers, seed=7)
    shares = [1.0] + [0.0] * (workers - 1)
    taken = flat(run_round(exchanges, values, shares=shares)[0])
    first_error = np.abs(taken - flat(values[0])).max()
    zeros = [[np.zeros_like(a) for a in values[0]] for _ in range(workers)]
    for _ in range(4):
        taken = taken + flat(run_round(exchanges, zeros)[0])
    # Each round owes the next only its own, smaller cut: the error shrinks geometrically
    # (before, it stalled at (1 - 1/W) of the first cut).
    assert np.abs(taken - flat(values[0])).max() < first_error / 20


@pytest.mark.parametrize("workers", [2, 3])
def test_an_int8_averager_round_pools_statistics_and_agrees_on_every_worker(workers):
    models = [batch_norm_model() for _ in range(workers)]
    averagers = [ModelStateAverager(m, optimizer_state=True, compression="int8") for m in models]
    for rank, (model, averager) in enumerate(zip(models, averagers)):
        averager.reset_anchor()  # the shared state every change is sent from
        set_statistics(model, np.full(3, rank + 1.0), np.full(3, 0.5 + rank / 10))
        for w in model.trainable_variables:
            w.assign(w + 0.01 * (rank + 1))
    plain = [[v.numpy() for v in read(a.variables)] for a in averagers]
    call = lambda averager, vals, share, feedback: averager.exchange(
        [tf.constant(v) for v in vals], feedback=feedback)
    results = run_round(averagers, plain, name="model_state", call=call)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    # The BatchNorm variance is pooled as a float32 round pools it, to int8's precision.
    # The largest change sent is the last worker's second moment about the reference
    # (mean 0, variance 1), v + m² − 1, and every chunk's step is at most 1/127 of it.
    largest = 0.5 + (workers - 1) / 10 + workers ** 2 - 1
    float32 = [ModelStateAverager(m, optimizer_state=True) for m in models]
    exact_round = lambda r: lambda: float32[r].exchange([tf.constant(v) for v in plain[r]])
    with FakeComm(workers, 0) as world:
        world.hold("model_state", {r: sent_by(r, workers, exact_round(r))["model_state"]
                                   for r in world.others})
        exact = exact_round(0)()
    for got, want in zip(results[0], exact):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2 * largest / 254)


def agreed_round(averagers: list[ModelStateAverager]) -> list[list[np.ndarray]]:
    """Each worker's round of its averager's state, the others' sends settled first; every
    worker must end it with the same bits."""
    workers = len(averagers)
    own = [read(a.variables) for a in averagers]
    sends = settled_sends(workers, lambda k: lambda: averagers[k].exchange(
        own[k], feedback=False))
    results = []
    for r in range(workers):
        with FakeComm(workers, r) as world:
            world.hold_sent({k: sent for k, sent in sends.items() if k != r})
            results.append([np.asarray(t) for t in averagers[r].exchange(own[r])])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    return results


def adam_averager(k: int, compression: str) -> ModelStateAverager:
    """Worker k's averager over a 2,000-value weight and Adam's two slots, the running
    squares spanning eight orders of magnitude, moved since the round's reference."""
    values = np.linspace(-1.0, 1.0, 2000)
    model = vector_model(values)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    build_optimizer(model)
    averager = ModelStateAverager(model, optimizer_state=True, compression=compression)
    squares = np.logspace(-12, -4, 2000)[None, :]
    momentum, velocity = optimizer_slots(model.optimizer)
    velocity.assign(squares)
    averager.reset_anchor()  # the shared state every change is sent from
    model.trainable_variables[0].assign([values + 0.01 * (k + 1)])
    momentum.assign(np.full((1, 2000), 1e-3 * (k + 1)))
    velocity.assign(squares * (1.0 + 0.5 * k))
    return averager


@pytest.mark.parametrize("compression", ["int8", "int4", "fp16"])
def test_compressed_rounds_send_adams_running_squares_in_float32(compression):
    # Coded against a chunk's largest change, a square of 1e-12 beside one of 1e-4 would
    # come back as 0 or as 1e-4 / 254; Adam divides by their roots.
    workers = 3
    averagers = [adam_averager(k, compression) for k in range(workers)]
    assert averagers[0].exact == [2]  # the kernel, its momentum, its running squares
    assert averagers[0].variables[2].path.endswith("velocity")
    results = agreed_round(averagers)
    squares = np.logspace(-12, -4, 2000)[None, :] * np.mean([1.0 + 0.5 * k for k in range(3)])
    np.testing.assert_allclose(results[0][2], squares, rtol=1e-5)
    # The rest is coded: off by at most two half-steps of the largest change, 0.03.
    np.testing.assert_allclose(results[0][1], np.full((1, 2000), 2e-3), rtol=0,
                               atol=2 * 0.03 / (2 * quantize.LEVELS.get(compression, 127)))
    coded = quantize.payload_bytes(2 * 2000, workers, compression)
    with FakeComm(workers, 0):
        assert averagers[0].payload_bytes == coded + 4 * 2000


@pytest.mark.parametrize("fragments", [1, 2])
def test_a_second_fit_in_consensus_keeps_what_the_last_round_owes(fragments):
    # A trainer makes a new fit at each change of epoch length; the workers then hold the
    # same bits, but their residuals are what the last round still owes. Only a new set
    # of workers, whose state came from a broadcast, starts without.
    from hvdtrain.keras import LocalSGD

    with FakeComm(2, 0) as world:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
        callback = LocalSGD(n_sync=1, round_compression="int4", round_fragments=fragments)
        callback.set_model(model)
        averager = callback.attach(model)
        parts = getattr(averager, "parts", [averager])
        for part in parts:
            part.compressed.residual.assign(tf.fill(part.compressed.residual.shape, 0.25))
        callback._world, callback._fits = world.world_id, 1
        callback.initial_state._given = (id(model), world.world_id)
        callback.progress.steps = callback.progress.consensus_step = 100
        callback._start_together()
        assert all(np.all(p.compressed.residual.numpy() == 0.25) for p in parts)
        callback._world = world.world_id + 1  # as after an elastic reset
        callback._start_together()
        assert not any(p.compressed.residual.numpy().any() for p in parts)



def run_topk_rounds(workers: int, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """`rounds` topk rounds, the first of each worker's own values and the rest of no
    change, checking after each that every worker took the same bits and that what was
    meant is taken or still owed; returns what was meant and what was taken."""
    exchanges = exchanges_for(workers, "topk")
    values = worker_values(workers, seed=20 + workers)
    zeros = [[np.zeros_like(a) for a in values[0]] for _ in range(workers)]
    meant = np.mean([flat(v) for v in values], axis=0)
    taken = np.zeros_like(meant)
    for t in range(rounds):
        results = run_round(exchanges, values if t == 0 else zeros)
        for other in results[1:]:
            for a, b in zip(results[0], other):
                np.testing.assert_array_equal(a, b)
        taken += flat(results[0])
        owed = np.mean([ex.residual.numpy().astype(np.float64) for ex in exchanges], axis=0)
        np.testing.assert_allclose(taken, meant - owed[:meant.size], rtol=0, atol=1e-5)
        if t == 0:  # the first round took only a thirty-second of each chunk, or less
            assert 0 < np.count_nonzero(taken) / meant.size <= 1.5 / 32
    return meant, taken


def test_topk_rounds_agree_bit_for_bit_and_lose_nothing():
    # A topk round sends 1/32 of each chunk: most of a change waits in the residuals, but
    # every worker takes the same bits, and what was meant is taken or still owed.
    meant, taken = run_topk_rounds(3, rounds=2)
    assert np.abs(taken - meant).max() > 0.1 * np.abs(meant).max()  # much is still owed


@pytest.mark.long  # 35 and 75 seconds here
@pytest.mark.parametrize("workers", [2, 4])
def test_topk_rounds_of_no_change_deliver_what_is_owed(workers):
    meant, taken = run_topk_rounds(workers, rounds=48)
    assert np.abs(taken - meant).max() < 0.05 * np.abs(meant).max()


@pytest.mark.parametrize("compression", ["topk", "int2", "int1"])
def test_a_coarse_round_pools_batch_norm_statistics_as_a_float32_round_does(compression):
    # A sparse round could send a moving mean's change without its variance's, int2 each
    # within a factor of 2; the statistics travel whole, in float32, so the pooled
    # variance is the float32 round's.
    workers = 3
    models = [batch_norm_model() for _ in range(workers)]
    averagers = [ModelStateAverager(m, compression=compression) for m in models]
    for rank, (model, averager) in enumerate(zip(models, averagers)):
        averager.reset_anchor()
        set_statistics(model, np.full(3, rank + 1.0), np.full(3, 0.5 + rank / 10))
    first = len(averagers[0].weights)
    statistics = range(first, first + len(averagers[0].statistics))
    assert averagers[0].exact == list(statistics) and len(statistics) == 2
    results = agreed_round(averagers)
    means = np.mean([np.full(3, r + 1.0) for r in range(workers)], axis=0)
    # Pooled: the mean of each worker's variance about the pooled mean.
    pooled = np.mean([0.5 + r / 10 + (r + 1.0 - means) ** 2 for r in range(workers)], axis=0)
    np.testing.assert_allclose(results[0][first], means, rtol=1e-6)
    np.testing.assert_allclose(results[0][first + 1], pooled, rtol=1e-5)
