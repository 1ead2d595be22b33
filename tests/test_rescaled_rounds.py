"""--rescale-rounds (`LocalSGD(rescale_rounds=True)`): a round's mean step of each weight
stretched to the workers' mean step length, at most by sqrt(workers). One process, the
other workers' sends from the same code (tests/fake_comm.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.config import load_config
from hvdtrain.errors import ArgumentError, ConfigError
from hvdtrain.keras.gradient_averaging import with_gradient_averaging
from hvdtrain.keras.local_sgd import LocalSGD
from hvdtrain.keras.state import ModelStateAverager, _stretch
from test_state_averaging_k_workers import round_at, vector_model


@pytest.mark.parametrize("mean, length, longest, expected", [
    ([1.0, 0.0], 2.0, 10.0, [2.0, 0.0]),     # the mean step, twice as long
    ([1.0, 0.0], 100.0, 3.0, [3.0, 0.0]),    # at most `longest` times
    ([0.0, 0.0], 1.0, 3.0, [0.0, 0.0]),      # no step: nothing to stretch
    ([0.6, 0.8], 0.5, 3.0, [0.3, 0.4]),      # longer than the workers' own: shortened
])
def test_stretch_gives_the_mean_step_the_workers_mean_length(mean, length, longest, expected):
    got = _stretch(tf.zeros(2), tf.constant(mean), tf.constant(length), longest)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


def moved_averagers(steps, compression="none"):
    """One averager a worker, over a weight of two values, each worker moved by its step
    from the shared origin [1, 1]."""
    averagers = []
    for step in steps:
        model = vector_model([1.0, 1.0])
        averager = ModelStateAverager(model, compression=compression, rescale=True)
        averager.reset_anchor()
        model.trainable_variables[0].assign([np.add([1.0, 1.0], step)])
        averagers.append(averager)
    return averagers


@pytest.mark.parametrize("compression", ["none", "fp16"])
@pytest.mark.parametrize("rank", [0, 1])
def test_two_orthogonal_steps_average_to_one_as_long_as_either(compression, rank):
    # Steps (1, 0) and (0, 1): the plain mean, (0.5, 0.5), is 0.71 long; stretched, 1.
    steps = [[1.0, 0.0], [0.0, 1.0]]
    averagers = moved_averagers(steps, compression)
    with_lengths = lambda world: world.hold("step_lengths", {1 - rank: [np.array([1.0])]})
    world, _ = round_at(rank, averagers, distances=[0.5, 0.5], before=with_lengths)
    got = averagers[rank].model.trainable_variables[0].numpy()
    np.testing.assert_allclose(got, [[1 + 0.5 ** 0.5, 1 + 0.5 ** 0.5]], rtol=1e-3)
    assert "step_lengths" in [call.name for call in world.calls]


def test_the_next_round_stretches_from_the_stretched_model():
    averagers = moved_averagers([[1.0, 0.0], [0.0, 1.0]])
    with_lengths = lambda world: world.hold("step_lengths", {1: [np.array([1.0])]})
    round_at(0, averagers, distances=[0.5, 0.5], before=with_lengths)
    np.testing.assert_allclose(averagers[0].origin[0].numpy(),
                               averagers[0].model.trainable_variables[0].numpy())


def test_a_rescaled_round_counts_a_float_a_weight_variable_more():
    plain, rescaled = (ModelStateAverager(vector_model([1.0, 2.0]), rescale=r)
                       for r in (False, True))
    assert rescaled.payload_bytes == plain.payload_bytes + 4


@pytest.mark.parametrize("overrides", [dict(hierarchical_sgd=True), dict(round_fragments=2)])
def test_rescale_rounds_is_refused_beside_rounds_it_cannot_stretch_in_one_line(overrides):
    with pytest.raises(ConfigError, match="^--rescale-rounds needs blocking flat rounds of the "
                                          "whole model, got --"):
        load_config(None, {"mode": "local", "rescale_rounds": True, **overrides})
    with pytest.raises(ConfigError, match="rescale-rounds"):
        load_config(None, {"mode": "async", "rescale_rounds": True})


def test_local_sgd_refuses_rescaled_overlapped_rounds():
    with pytest.raises(ArgumentError, match=r"^LocalSGD\(rescale_rounds=True\) needs blocking"):
        LocalSGD(n_sync=2, overlap=True, rescale_rounds=True)


def compiled(optimizer) -> keras.Model:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, use_bias=False)])
    model.compile(optimizer, "mse")
    return model


@pytest.mark.parametrize("optimizer, options, rescaled", [
    (lambda: keras.optimizers.Lamb(0.01), {}, True),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Lamb(0.01)), {}, True),
    (lambda: with_gradient_averaging(keras.optimizers.Lamb(0.01), averaging=False), {}, True),
    (lambda: keras.optimizers.SGD(0.01, momentum=0.9), {}, False),
    (lambda: keras.optimizers.Lamb(0.01), dict(rescale_rounds=False), False),
    (lambda: keras.optimizers.SGD(0.01), dict(rescale_rounds=True), True),
    (lambda: keras.optimizers.Lamb(0.01), dict(overlap=True), False),
    (lambda: keras.optimizers.Lamb(0.01), dict(average_optimizer_state=True), False),
])
def test_local_sgd_rescales_lambs_rounds_unless_told_as_the_cli_does(optimizer, options,
                                                                     rescaled):
    averager = LocalSGD(n_sync=2, **options).attach(compiled(optimizer()))
    assert (averager.origin is not None) == rescaled


def test_a_round_spec_leaves_rescaling_to_the_optimizer_as_the_keywords_do():
    # A spec made without the optimizer cannot know it: on a Keras Lamb its rounds are
    # rescaled as the keyword form's are, and told otherwise they are not.
    from hvdtrain.rounds.spec import RoundSpec

    for chosen, rescaled in (({}, True), ({"rescale_rounds": False}, False)):
        for layer in (LocalSGD(RoundSpec(n_sync=2, round_compression="int8", **chosen)),
                      LocalSGD(n_sync=2, round_compression="int8", **chosen)):
            averager = layer.attach(compiled(keras.optimizers.Lamb(0.01)))
            assert (averager.origin is not None) == rescaled
