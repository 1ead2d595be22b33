"""Whether the outer step (SlowMo, Nesterov: hvdtrain.averaging.outer_step) is a stock
`keras.optimizers.SGD` step on the averaged pseudo-gradient x0 − x̄, as torchft's DiLoCo
takes torch.optim.SGD's.

It is while the inner rate γ stays the same, and not otherwise. SlowMo keeps its buffer
in units of the gradient, u ← β u + (x0 − x̄) / γ, and steps α γ u with the rate of this
round; Keras keeps the step itself, v ← β v − α (x0 − x̄), and steps v. With v = −α γ u
the two are one update while γ is fixed; when γ changes from γ' to γ, SlowMo's past
momentum is scaled by γ / γ' and Keras's is not. hvdtrain's runs change γ every round
(warmup, then cosine or steps), so the named outer optimizers keep SlowMo's maths.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.averaging import outer_step

# Exact in float32, where Keras keeps its rate and momentum.
ALPHA, BETA = 0.75, 0.875


def pseudo_gradients(rounds: int) -> list[np.ndarray]:
    """x0 − x̄ of each round: what the workers moved, on average, since the last one."""
    rng = np.random.default_rng(0)
    return [rng.normal(scale=0.01, size=5) for _ in range(rounds)]


def slowmo(rates, nesterov: bool) -> np.ndarray:
    x0, buffer = np.ones(5), np.zeros(5)
    for gamma, change in zip(rates, pseudo_gradients(len(rates))):
        x0, buffer = outer_step(x0, x0 - change, buffer, gamma, ALPHA, BETA, nesterov)
    return x0


def keras_sgd(rates, nesterov: bool) -> np.ndarray:
    x0 = keras.Variable(np.ones(5), dtype="float64")
    sgd = keras.optimizers.SGD(learning_rate=ALPHA, momentum=BETA, nesterov=nesterov)
    for change in pseudo_gradients(len(rates)):
        sgd.apply_gradients([(tf.constant(change), x0)])
    return x0.numpy()


@pytest.mark.parametrize("nesterov", [False, True])
def test_at_a_fixed_inner_rate_the_outer_step_is_keras_sgd_on_the_pseudo_gradient(nesterov):
    rates = [0.05] * 8
    np.testing.assert_allclose(keras_sgd(rates, nesterov), slowmo(rates, nesterov),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_when_the_inner_rate_changes_slowmo_rescales_its_past_momentum_and_keras_does_not(
        nesterov):
    rates = [0.05 * 0.7 ** t for t in range(8)]  # a decaying schedule
    gap = np.abs(keras_sgd(rates, nesterov) - slowmo(rates, nesterov)).max()
    assert gap > 1e-3  # not rounding: whole past steps scaled differently
    # Keras's SGD is SlowMo at a fixed rate, whatever the rates were.
    np.testing.assert_allclose(keras_sgd(rates, nesterov), slowmo([1.0] * 8, nesterov),
                               rtol=0, atol=1e-12)
