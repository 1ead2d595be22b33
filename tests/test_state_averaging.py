"""ModelStateAverager: in one process (a world of one worker), and on two real workers whose
state differs in known ways (BatchNorm variance pooling, fp16 rounds that send changes,
LocalSGD's fp16_allreduce among them)."""

import numpy as np
import pytest
import keras

from conftest import horovodrun, load_rank_files
from hvdtrain import comm
from hvdtrain.rounds import quantize
from hvdtrain.rounds.averaging import outer_step
from hvdtrain.keras.state import ModelStateAverager, OuterOptimizer, batch_norm_statistics
from hvdtrain.models import build_model


@pytest.mark.parametrize("outer", [None, OuterOptimizer(1.0, 0.5)])
def test_traced_ahead_the_rounds_reuse_the_graph_instead_of_tracing_again(outer):
    comm.init()
    model = build_model("lenet", (28, 28, 1), 10)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    averager = ModelStateAverager(model, outer=outer)
    averager.trace(apply_outer=True)
    assert averager._average_fn.experimental_get_tracing_count() == 1
    before = [w.numpy().copy() for w in model.trainable_variables]
    for _ in range(3):
        assert averager.average(apply_outer=True) == 0.0  # one worker: nothing moves
    assert averager._average_fn.experimental_get_tracing_count() == 1
    for w, b in zip(model.trainable_variables, before):
        assert (w.numpy() == b).all()


def _batch_norm_model():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    x = keras.Input((3,))
    model = keras.Model(x, keras.layers.Dense(2)(inner(x)))
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    return model


def test_batchnorm_statistics_are_found_inside_nested_models():
    model = _batch_norm_model()
    bn = model.layers[1].layers[-1]
    assert batch_norm_statistics(model) == [(bn.moving_mean, bn.moving_variance)]
    averager = ModelStateAverager(model)
    position = {id(v): i for i, v in enumerate(averager.variables)}
    assert averager._moments == [(position[id(bn.moving_mean)], position[id(bn.moving_variance)])]


def test_without_fp16_a_round_keeps_no_reference_and_sends_the_same_bytes():
    comm.init()
    model = _batch_norm_model()
    plain = ModelStateAverager(model, optimizer_state=True, outer=OuterOptimizer(1.0, 0.5))
    assert plain.reference is None
    sizes = [v.numpy().size for v in plain.variables]
    assert plain.payload_bytes == 4 * sum(sizes)
    # fp16 halves the payload; the reference adds variables, not bytes.
    fp16 = ModelStateAverager(model, optimizer_state=True, outer=OuterOptimizer(1.0, 0.5),
                              compression="fp16")
    assert fp16.payload_bytes == 2 * sum(sizes) == quantize.payload_bytes(sum(sizes), 1, "fp16")
    assert len(fp16.reference) == len(fp16.variables)
    assert fp16.reference[:len(fp16.weights)] == fp16.anchor  # SlowMo's x0, not a copy


@pytest.mark.parametrize("fp16", [False, True])
def test_a_one_worker_round_leaves_batchnorm_statistics_exactly_as_they_were(fp16):
    comm.init()
    model = _batch_norm_model()
    bn = model.layers[1].layers[-1]
    # A large mean over a small spread: v + m² − m² in float32 would not give v back.
    bn.moving_mean.assign([100.0, -30.0, 0.0])
    bn.moving_variance.assign([0.01, 0.003, 1.0])
    before = [v.numpy().copy() for v in model.weights]
    ModelStateAverager(model, compression="fp16" if fp16 else "none").average()
    for v, b in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), b)


# --- two real workers (tests/workers/state_averaging_worker.py) ---

@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("state_averaging")
    horovodrun("state_averaging_worker.py", str(root))
    return load_rank_files(str(root), "state")


def _same_on_both_ranks(ranks, key):
    np.testing.assert_array_equal(ranks[0][key], ranks[1][key])
    return ranks[0][key].astype(np.float64)


F32 = np.float32
STEP = 1e-4
# The weights sit in [1, 2): float32 rounds them to within 2^-24.
F32_HALF_ULP_AT_1 = 2.0 ** -24


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_fp16_rounds_send_the_change_so_a_small_update_survives(ranks):
    # Compressing the weights themselves rounds 1 + 5e-5 to 1: the update is lost...
    assert _same_on_both_ranks(ranks, "fp16_whole")[0] == 1.0
    # ...where sending the change keeps it, to fp16 precision of the change.
    first = _same_on_both_ranks(ranks, "fp16_round1")[0]
    expected = (float(F32(1.0 + STEP)) + 1.0) / 2
    assert abs(first - expected) <= STEP * 2.0 ** -10 + F32_HALF_ULP_AT_1
    assert first - 1.0 > 0.9 * STEP / 2
    # The second round sends its change from the first round's consensus.
    second = _same_on_both_ranks(ranks, "fp16_round2")[0]
    expected = (first + float(F32(first + 2 * STEP))) / 2
    assert abs(second - expected) <= 2 * STEP * 2.0 ** -10 + F32_HALF_ULP_AT_1
    # One float16 per round, padded to a whole shard for each of the two workers.
    assert int(ranks[0]["fp16_payload"]) == quantize.payload_bytes(1, 2, "fp16") == 4


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_fp16_slowmo_follows_the_exact_outer_steps_of_small_updates(ranks):
    rows = _same_on_both_ranks(ranks, "slowmo")  # per round: weight, buffer u, anchor x0
    np.testing.assert_array_equal(rows[:, 0], rows[:, 2])  # every rank holds x0
    x0, u, held = 1.0, 0.0, 1.0
    for row, moves in zip(rows, ((STEP, 0.0), (STEP, STEP))):
        mean = np.mean([float(F32(held + m)) for m in moves])
        x0, u = outer_step(x0, mean, u, 0.1, 1.0, 0.5)
        # fp16 precision of the change, passed on to u with a factor 1 / inner lr.
        assert abs(row[0] - x0) <= 4 * STEP * 2.0 ** -10 + 2 * F32_HALF_ULP_AT_1
        assert abs(row[1] - u) <= (4 * STEP * 2.0 ** -10 + 2 * F32_HALF_ULP_AT_1) / 0.1
        held = row[0]
    assert u < -1e-3  # momentum built from updates that rounding the weights would lose


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_fp16_hand_over_from_rank_0_sends_its_change(ranks):
    chief = _same_on_both_ranks(ranks, "chief")[0]
    assert abs(chief - float(F32(1.0 + STEP))) <= STEP * 2.0 ** -11 + F32_HALF_ULP_AT_1


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
@pytest.mark.parametrize("optimizer", ["Adam", "Adadelta", "Adamax"])
@pytest.mark.parametrize("kind", ["mean", "chief"])
def test_fp16_rounds_keep_running_squares_and_norms_non_negative(ranks, optimizer, kind):
    # Adam's velocity, Adadelta's accumulated squares, Adamax's norm: each slot came back
    # from reference 5.5e-8 plus a float16 change that overshoots 2e-8 below zero.
    squares = _same_on_both_ranks(ranks, f"squares_{optimizer}_{kind}")
    assert squares.size >= 1 + (optimizer == "Adadelta")  # every such slot was found
    assert (squares >= 0).all(), squares


def _pooled(means, variances):
    means, variances = np.asarray(means, np.float64), np.asarray(variances, np.float64)
    mean = means.mean(axis=0)
    return mean, (variances + means ** 2).mean(axis=0) - mean ** 2


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
@pytest.mark.parametrize("key", ["pooled", "sync_mode"])
def test_batchnorm_variance_is_pooled_across_workers(ranks, key):
    from workers.state_averaging_worker import BN_MEANS, BN_VARIANCES

    mean, variance = _same_on_both_ranks(ranks, key)
    expected_mean, expected_variance = _pooled(BN_MEANS, BN_VARIANCES)
    np.testing.assert_allclose(mean, expected_mean, rtol=1e-6)
    np.testing.assert_allclose(variance, expected_variance, rtol=1e-6)
    # Means 0 and 2 with variances 1: pooled 2, where averaging the variances gave 1.
    assert variance[0] == pytest.approx(2.0)


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_hand_over_from_rank_0_takes_its_batchnorm_statistics_as_they_are(ranks):
    from workers.state_averaging_worker import BN_MEANS, BN_VARIANCES

    mean, variance = _same_on_both_ranks(ranks, "pooled_chief")
    np.testing.assert_array_equal(mean, F32(BN_MEANS[0]))
    np.testing.assert_array_equal(variance, F32(BN_VARIANCES[0]))


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_fp16_rounds_pool_batchnorm_variance_from_the_changes(ranks):
    from workers.state_averaging_worker import (BASE_MEAN, BASE_VARIANCE, MEAN_STEPS,
                                                SLOT_BASE, SLOT_STEPS, VARIANCE_STEPS)

    mean, variance = _same_on_both_ranks(ranks, "pooled_fp16")
    held_means = [F32(BASE_MEAN + s) for s in MEAN_STEPS]
    held_variances = [F32(BASE_VARIANCE + s) for s in VARIANCE_STEPS]
    expected_mean, expected_variance = _pooled(held_means, held_variances)
    # fp16 precision of each channel's changes (at most 0.3 here), plus float32 rounding:
    # far below float16's own 2^-7 at a mean of 10.
    changes = np.abs(np.concatenate([MEAN_STEPS, VARIANCE_STEPS])).max(axis=0)
    tolerance = changes * 2.0 ** -9 + 2.0 ** -23 * (np.abs(expected_mean) + expected_variance)
    assert (np.abs(mean - expected_mean) <= tolerance).all()
    assert (np.abs(variance - expected_variance) <= tolerance).all()
    slots = _same_on_both_ranks(ranks, "slots_fp16")
    np.testing.assert_allclose(slots, np.mean([F32(SLOT_BASE + s) for s in SLOT_STEPS]),
                               rtol=0, atol=3e-4 * 2.0 ** -10 + 2.0 ** -25)


@pytest.mark.ci
@pytest.mark.long  # their job takes 35 seconds here
@pytest.mark.multiprocess
def test_local_sgd_fit_with_fp16_and_slowmo_ends_every_round_in_consensus(ranks):
    # Different initial weights per rank: the references are taken after the broadcast.
    # Each rank trained on its own data; the last step (an epoch end) ends in a round, sent
    # as fp16 compressed rounds by LocalSGD(fp16_allreduce=True): the same bits on both.
    _same_on_both_ranks(ranks, "fit_state")
