import pytest

from hvdtrain.stats import mean_ci95, per_batch_values, sliding_mean


def test_mean_and_95_percent_interval_use_student_t():
    mean, ci = mean_ci95([10.0, 12.0, 14.0])
    # sd = 2, n = 3, t(2) = 4.303 -> 4.303 * 2 / sqrt(3)
    assert mean == 12.0 and ci == pytest.approx(4.303 * 2 / 3 ** 0.5)
    assert mean_ci95([5.0]) == (5.0, 0.0)
    assert mean_ci95([1.0] * 100) == (1.0, 0.0)
    with pytest.raises(ValueError):
        mean_ci95([])


def test_per_batch_values_undo_keras_running_means():
    batches = [0.9, 0.5, 0.7, 0.1]
    running = [sum(batches[:i + 1]) / (i + 1) for i in range(len(batches))]
    assert per_batch_values(running) == pytest.approx(batches)
    assert per_batch_values([]) == []


def test_sliding_mean_averages_the_last_window_values():
    values = [4.0, 2.0, 6.0, 0.0, 8.0]
    assert sliding_mean(values, 2) == pytest.approx([4.0, 3.0, 4.0, 3.0, 4.0])
    assert sliding_mean(values, 1) == values
    # A window longer than the series is the running mean.
    assert sliding_mean(values, 400) == pytest.approx([4.0, 3.0, 4.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        sliding_mean(values, 0)
