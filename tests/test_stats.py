import pytest

from hvdtrain.stats import mean_ci95


def test_mean_and_95_percent_interval_use_student_t():
    mean, ci = mean_ci95([10.0, 12.0, 14.0])
    # sd = 2, n = 3, t(2) = 4.303 -> 4.303 * 2 / sqrt(3)
    assert mean == 12.0 and ci == pytest.approx(4.303 * 2 / 3 ** 0.5)
    assert mean_ci95([5.0]) == (5.0, 0.0)
    assert mean_ci95([1.0] * 100) == (1.0, 0.0)
    with pytest.raises(ValueError):
        mean_ci95([])
