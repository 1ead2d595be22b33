"""Whether the outer step (SlowMo, Nesterov: hvdtrain.rounds.averaging.outer_step) is a stock
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

from hvdtrain import comm
from hvdtrain.rounds.averaging import outer_step
from hvdtrain.keras.state import ModelStateAverager, OuterOptimizer, build_optimizer

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


def one_weight_model() -> keras.Model:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(5, use_bias=False)])
    model.compile(keras.optimizers.SGD(0.05), "mse")  # a fixed inner rate
    build_optimizer(model)
    model.trainable_variables[0].assign(np.ones((1, 5)))
    return model


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_keras_optimizer_as_the_outer_one_takes_slowmos_rounds_at_a_fixed_inner_rate(nesterov):
    comm.init()  # one worker: x̄ is the worker's own weights
    ends = []
    for outer in (OuterOptimizer(ALPHA, BETA, nesterov),
                  keras.optimizers.SGD(ALPHA, momentum=BETA, nesterov=nesterov)):
        model = one_weight_model()
        averager = ModelStateAverager(model, outer=outer)
        averager.reset_anchor()
        (weight,) = model.trainable_variables
        for change in pseudo_gradients(6):
            weight.assign(weight - change.reshape(1, 5).astype(np.float32))
            averager.average()
        ends.append(weight.numpy())
        # What a checkpoint keeps of the outer step: SlowMo's buffer, or Keras's momentum.
        assert len(averager.outer_state) == (1 if isinstance(outer, OuterOptimizer) else 3)
    np.testing.assert_allclose(ends[1], ends[0], rtol=0, atol=1e-6)
    assert np.abs(ends[0] - 1).max() > 0.01
