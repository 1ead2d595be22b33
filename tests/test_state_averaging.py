"""ModelStateAverager in one process (a world of one worker): tracing ahead of the first round."""

import pytest
import keras

from hvdtrain import comm
from hvdtrain.keras.state import ModelStateAverager, OuterOptimizer
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
    assert averager.rounds == 3
    for w, b in zip(model.trainable_variables, before):
        assert (w.numpy() == b).all()
