"""LARS (hvdtrain.keras.lars) against the paper's update written out in numpy, and the
optimizers --optimizer builds, alone and in mixed precision's LossScaleOptimizer."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from hvdtrain.keras.lars import LARS  # noqa: E402

SHAPES = {"kernel": (3, 4), "bias": (4,), "gamma": (4,), "scale_1d": (5,)}


def paper_steps(weights: dict, grads: list[dict], lr: float, momentum: float, eta: float,
                decay: float) -> dict:
    """You et al. 2017, Algorithm 1, for every variable of two or more dimensions whose
    name is not a bias or BatchNorm's; momentum SGD for the rest."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    for step in grads:
        for name, g in step.items():
            if w[name].ndim > 1 and name not in ("bias", "gamma", "beta"):
                w_norm, g_norm = np.linalg.norm(w[name]), np.linalg.norm(g)
                local = eta * w_norm / (g_norm + decay * w_norm) if w_norm and g_norm else 1.0
                update = local * (g + decay * w[name])
            else:
                update = g
            v[name] = momentum * v[name] + lr * update
            w[name] = w[name] - v[name]
    return w


def run_lars(optimizer, weights: dict, grads: list[dict]) -> dict:
    variables = {name: keras.Variable(value, name=name) for name, value in weights.items()}
    for step in grads:
        optimizer.apply([step[name] for name in variables], list(variables.values()))
    return {name: np.asarray(var.numpy(), np.float64) for name, var in variables.items()}


def _problem(seed=0, steps=4):
    rng = np.random.default_rng(seed)
    weights = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: rng.normal(scale=0.1, size=s).astype(np.float32) for k, s in SHAPES.items()}
             for _ in range(steps)]
    return weights, grads


@pytest.mark.parametrize("momentum, decay", [(0.9, 0.0), (0.9, 5e-4), (0.0, 1e-3)])
def test_lars_follows_the_papers_update_for_several_steps(momentum, decay):
    weights, grads = _problem()
    got = run_lars(LARS(learning_rate=2.0, momentum=momentum, eta=0.01, weight_decay=decay),
                   weights, grads)
    want = paper_steps(weights, grads, 2.0, momentum, 0.01, decay)
    for name in SHAPES:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)
    # The kernel moved by about lr x eta of its norm a step, not by lr x |g|.
    assert not np.allclose(got["kernel"], weights["kernel"] - 2.0 * sum(
        g["kernel"] for g in grads), atol=1e-3)


def test_a_zero_gradient_or_zero_weights_take_the_ratio_of_one():
    weights, grads = _problem(steps=1)
    weights["kernel"][:] = 0.0                        # |w| = 0: the plain step
    got = run_lars(LARS(learning_rate=0.5, momentum=0.0, eta=0.01), weights, grads)
    np.testing.assert_allclose(got["kernel"], -0.5 * grads[0]["kernel"], rtol=1e-6)
    weights, grads = _problem(steps=1)
    grads[0]["kernel"][:] = 0.0                       # |g| = 0, with decay: ratio 1
    got = run_lars(LARS(learning_rate=0.5, momentum=0.0, eta=0.01, weight_decay=0.1),
                   weights, grads)
    np.testing.assert_allclose(got["kernel"], weights["kernel"] * (1 - 0.5 * 0.1), rtol=1e-6)


def test_lars_round_trips_its_config():
    optimizer = LARS(learning_rate=3.0, momentum=0.8, eta=0.002, weight_decay=1e-4,
                     exclude_names=("bias",))
    clone = LARS.from_config(optimizer.get_config())
    assert (clone.momentum, clone.eta, clone.lars_weight_decay, clone.exclude_names) == (
        0.8, 0.002, 1e-4, ("bias",))
    assert clone.weight_decay is None  # Keras's own decoupled decay stays off


@pytest.mark.parametrize("optimizer", ["lars", "lamb"])
@pytest.mark.parametrize("mixed_precision", [False, True])
def test_the_run_builds_lars_and_lamb_with_gradient_averaging_and_mixed_precision(
        optimizer, mixed_precision):
    from hvdtrain import comm
    from hvdtrain.config import TrainConfig
    from hvdtrain.keras.gradient_averaging import averaging_optimizer
    from hvdtrain.keras.state import base_optimizer
    from hvdtrain.training.optimizers import make_optimizer

    comm.init()  # a world of one worker
    cfg = TrainConfig(optimizer=optimizer, mixed_precision=mixed_precision, weight_decay=1e-4)
    built = make_optimizer(cfg, 1.0, averaging=True)
    inner = base_optimizer(built)
    assert isinstance(inner, LARS if optimizer == "lars" else keras.optimizers.Lamb)
    assert isinstance(built, keras.optimizers.LossScaleOptimizer) == mixed_precision
    assert averaging_optimizer(built) is built
    weights, grads = _problem(steps=2)
    variables = [keras.Variable(weights[name], name=name) for name in SHAPES]
    for step in grads:
        built.apply([step[name] for name in SHAPES], variables)
    assert all(np.all(np.isfinite(v.numpy())) for v in variables)
    assert not np.allclose(variables[0].numpy(), weights["kernel"])
    if optimizer == "lars":  # its own decay in its step, not Keras's as well
        assert inner.weight_decay is None and inner.lars_weight_decay == 1e-4
