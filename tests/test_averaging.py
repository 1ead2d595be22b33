import numpy as np
import pytest

from hvdtrain.rounds.averaging import (bytes_allreduced, expected_bytes_allreduced, gradient_steps,
                                is_local_sync_step, outer_step, payload_bytes, pooled_variance,
                                second_moment, sync_points)


def test_local_rounds_every_n_sync_steps_after_warm_start():
    assert [s for s in range(1, 13) if is_local_sync_step(s, 4)] == [4, 8, 12]
    assert [s for s in range(1, 13) if is_local_sync_step(s, 4, warm_start_steps=3)] == [7, 11]


def test_sync_points_add_epoch_ends_and_the_end_of_warm_start():
    # 2 epochs of 10 steps, n_sync 4, warm start 3 steps.
    assert sync_points(20, 10, 4, 3) == [3, 7, 10, 11, 15, 19, 20]
    assert sync_points(20, 10, 5) == [5, 10, 15, 20]
    assert sync_points(6, 6, 1) == [1, 2, 3, 4, 5, 6]


def test_payload_bytes_counts_elements_times_itemsize():
    assert payload_bytes([((3, 4), 4), ((10,), 2), ((), 8)]) == 48 + 20 + 8


def test_local_sgd_allreduces_about_n_sync_times_fewer_bytes_than_sync():
    weights = 1_000_000  # bytes of gradients == bytes of weights
    steps, per_epoch = 4680, 468
    sync = expected_bytes_allreduced("sync", steps, per_epoch, 1, 0, weights, weights, 0)
    assert sync == steps * weights
    for n_sync in (10, 50, 100, 600):
        local = expected_bytes_allreduced("local", steps, per_epoch, n_sync, 0, weights, weights, 0)
        # Epoch-end rounds add a little on top of steps / n_sync.
        assert steps // n_sync <= local / weights <= steps // n_sync + 10
        assert sync / local == pytest.approx(n_sync, rel=0.6 if n_sync == 600 else 0.25)


def test_warm_start_steps_are_charged_as_gradient_steps():
    assert gradient_steps(100, "local", 30) == 30
    assert gradient_steps(100, "sync") == 100
    total = expected_bytes_allreduced("local", 100, 50, 10, 30, 8, 12, 0)
    assert total == bytes_allreduced(30, 8, len(sync_points(100, 50, 10, 30)), 12)


def test_a_one_worker_warm_start_sends_no_gradients_but_its_hand_over_is_a_round():
    assert gradient_steps(100, "local", 30, "single") == 0
    total = expected_bytes_allreduced("local", 100, 50, 10, 30, 8, 12, 0, warm_start="single")
    # The hand-over at 30, then 40, 50, ..., 100 (the epoch ends 50 and 100 among them).
    assert total == 12 * len(sync_points(100, 50, 10, 30)) == 12 * (1 + 7)


def test_slowmo_with_alpha_1_beta_0_is_plain_averaging():
    rng = np.random.default_rng(0)
    x0, avg = rng.normal(size=5), rng.normal(size=5)
    new_x0, buf = outer_step(x0, avg, np.zeros(5), inner_lr=0.05, outer_lr=1.0, outer_momentum=0.0)
    np.testing.assert_allclose(new_x0, avg, rtol=1e-12)
    np.testing.assert_allclose(buf, (x0 - avg) / 0.05)


def test_slowmo_momentum_accumulates_outer_gradients():
    x0 = np.array([1.0])
    lr, alpha, beta = 0.1, 1.0, 0.5
    # Round 1: average moved by -0.1, so u = 1.0, x0 = 0.9.
    x1, u1 = outer_step(x0, np.array([0.9]), np.zeros(1), lr, alpha, beta)
    np.testing.assert_allclose([x1[0], u1[0]], [0.9, 1.0])
    # Round 2: the average again moves by -0.1 from x1; momentum adds half the last step.
    x2, u2 = outer_step(x1, np.array([0.8]), u1, lr, alpha, beta)
    np.testing.assert_allclose([u2[0], x2[0]], [1.5, 0.75])


def test_nesterov_outer_step_looks_ahead():
    x, u = outer_step(np.array([1.0]), np.array([0.9]), np.array([1.0]), 0.1, 1.0, 0.5,
                      nesterov=True)
    # g = 1, u = 0.5 + 1 = 1.5, step = 0.5 * 1.5 + 1 = 1.75 -> x = 1 - 0.175
    np.testing.assert_allclose([u[0], x[0]], [1.5, 0.825])


def test_gradient_buckets_start_from_the_last_layer_and_respect_the_cap():
    from hvdtrain.rounds.averaging import gradient_buckets

    sizes = [10, 40, 5, 30, 20]
    assert gradient_buckets(sizes, 50) == [[4, 3], [2, 1], [0]]
    # A gradient larger than the cap travels alone; cap 0 is one group of everything.
    assert gradient_buckets(sizes, 25) == [[4], [3], [2], [1], [0]]
    assert gradient_buckets(sizes, 0) == [[4, 3, 2, 1, 0]]
    assert gradient_buckets(sizes, 1e9) == [[4, 3, 2, 1, 0]]
    assert gradient_buckets([], 50) == []
    # Every gradient in exactly one group.
    assert sorted(i for b in gradient_buckets(sizes, 45) for i in b) == list(range(5))


def _pool(means, variances, shift=0.0):
    """What a round computes: the allreduced means of the means and of the second moments."""
    means, variances = np.asarray(means), np.asarray(variances)
    return pooled_variance(means.mean(axis=0),
                           second_moment(means, variances, shift).mean(axis=0), shift)


def test_pooled_variance_adds_the_spread_of_the_workers_means():
    # Means 0 and 2, variances 1 and 1: data at 0 ± 1 and 2 ± 1 together spread as 1 ± √2.
    assert _pool([0.0, 2.0], [1.0, 1.0]) == 2.0
    # Equal means: the arithmetic mean of the variances.
    assert _pool([3.0, 3.0, 3.0], [1.0, 2.0, 6.0]) == 3.0
    # One worker: its own variance.
    assert _pool([5.0], [0.25]) == 0.25


def test_pooled_variance_is_the_variance_of_all_workers_data_together():
    rng = np.random.default_rng(0)
    # 4 workers, 100 samples each, 3 channels, each worker's data around its own mean.
    shards = rng.normal(loc=rng.normal(size=(4, 1, 3)), size=(4, 100, 3))
    pooled = _pool(shards.mean(axis=1), shards.var(axis=1))
    np.testing.assert_allclose(pooled, shards.reshape(-1, 3).var(axis=0), rtol=1e-12)


def test_a_shift_shared_by_the_workers_gives_the_same_pool_with_less_rounding():
    means, variances = np.float32([1000.0, 1000.5]), np.float32([0.01, 0.03])
    exact = _pool(means.astype(np.float64), variances.astype(np.float64))
    assert exact == pytest.approx(0.0825)
    shifted = _pool(means, variances, shift=np.float32(1000.0))
    assert shifted == pytest.approx(exact, rel=1e-6)
    # Unshifted, float32 holds m² ≈ 1e6 only to about 0.06: most of the variance is lost.
    assert abs(_pool(means, variances) - exact) > 1e-3


def test_pooled_variance_clamps_the_cancellation_below_zero_at_zero():
    assert pooled_variance(1.0, 1.0 - 1e-12) == 0.0
    pooled = pooled_variance(np.array([1.0, 2.0]), np.array([1.0 - 1e-12, 4.5]))
    assert pooled.tolist() == [0.0, 0.5]


def test_pooled_variance_runs_on_tensorflow_tensors_as_on_numpy():
    import tensorflow as tf

    means, variances = np.float32([[0.0, 1.0], [2.0, 1.0]]), np.float32([[1.0, 0.5], [1.0, 0.0]])
    mean = tf.reduce_mean(tf.constant(means), axis=0)
    moment = tf.reduce_mean(second_moment(tf.constant(means), tf.constant(variances), 0.5), axis=0)
    np.testing.assert_allclose(pooled_variance(mean, moment, 0.5).numpy(),
                               _pool(means, variances), rtol=1e-6)
