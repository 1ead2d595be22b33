"""The fake `hvdtrain.comm` (tests/fake_comm.py) that lets multi-worker logic run in one
process: strict about what the other workers hold, complete over comm's functions."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from fake_comm import PURE, BadPeerValues, FakeComm, FakeCommError, MissingPeerValues, sent_by
from hvdtrain import comm
from hvdtrain.keras.state import ModelStateAverager, build_optimizer


def _one_weight_model(value: float) -> keras.Model:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    build_optimizer(model)
    model.trainable_variables[0].assign([[value]])
    return model


@pytest.mark.parametrize("traced", [False, True])
def test_a_round_whose_other_workers_values_were_not_given_fails_instead_of_returning_its_input(
        traced):
    averager = ModelStateAverager(_one_weight_model(3.0))
    with FakeComm(workers=2, rank=0), pytest.raises(MissingPeerValues, match="'model_state'"):
        if traced:
            averager.average()  # a tf.function: fails while tracing
        else:
            averager.exchange([tf.constant([[3.0]])])
    assert averager.weights[0].numpy()[0, 0] == 3.0


def test_values_held_for_the_wrong_ranks_count_or_shape_fail():
    with FakeComm(workers=3, rank=1) as world:
        world.hold("x", {0: [1.0]})  # rank 2 missing
        with pytest.raises(BadPeerValues, match=r"ranks \[0\], but it needs ranks \[0, 2\]"):
            comm.average([tf.constant(1.0)], name="x")
        world.hold("x", {0: [1.0, 2.0], 2: [1.0, 2.0]})
        with pytest.raises(BadPeerValues, match="list of 1 values"):
            comm.average([tf.constant(1.0)], name="x")
        world.hold("x", {0: [[1.0, 2.0]], 2: [[1.0, 2.0]]})
        with pytest.raises(BadPeerValues, match=r"shape \(2,\), this worker's \(\)"):
            comm.total([tf.constant(1.0)], name="x")
        world.hold("m", {0: {"loss": 1.0}, 2: {"accuracy": 0.5}})
        with pytest.raises(BadPeerValues, match="rank 2 holds"):
            comm.average_scalars({"loss": 2.0}, name="m")


def test_every_function_of_comm_is_faked_or_refused_and_comes_back_after():
    originals = {name: value for name, value in vars(comm).items()
                 if inspect.isfunction(value) and value.__module__ == comm.__name__
                 and not name.startswith("_")}
    with FakeComm(workers=2, rank=1):
        for name, original in originals.items():
            assert (getattr(comm, name) is original) == (name in PURE), name
        assert (comm.rank(), comm.size(), comm.is_chief()) == (1, 2, False)
        with pytest.raises(FakeCommError, match="elastic_run needs a real Horovod"):
            comm.elastic_run(lambda state: None)
    for name, original in originals.items():
        assert getattr(comm, name) is original


def test_hosts_give_each_worker_its_host_group_and_local_rank():
    with FakeComm(workers=4, rank=2, hosts=[(0, 1), (2, 3)]) as world:
        group = comm.host_group()
        assert (group.ranks, group.hosts) == ((2, 3), 2)
        assert (comm.local_rank(), comm.local_size()) == (0, 2)
        world.hold("g", {3: [np.array([5.0])]})  # only the host's other worker takes part
        (mean,) = comm.average([tf.constant([1.0])], name="g", group=group)
        assert mean.numpy()[0] == 3.0


def test_a_traced_collective_takes_the_values_held_when_it_runs_not_when_traced():
    with FakeComm(workers=3, rank=0) as world:
        mean = tf.function(lambda x: comm.average([x], name="x")[0])
        world.hold("x", {1: [2.0], 2: [3.0]})
        assert mean(tf.constant(1.0)).numpy() == 2.0
        world.hold("x", {1: [5.0], 2: [6.0]})
        assert mean(tf.constant(1.0)).numpy() == 4.0
        assert [call.sent for call in world.calls] == [[1.0], [1.0]]


def test_fp16_collectives_round_every_workers_value_to_float16():
    # What makes fp16 rounds send changes: 1 + 1e-4 is 1 in float16.
    with FakeComm(workers=2, rank=0) as world:
        world.hold("x", {1: [np.float32(1.0 + 1e-4)]})
        (rounded,) = comm.average([tf.constant(1.0 + 1e-4)], name="x", fp16=True)
        (exact,) = comm.average([tf.constant(1.0 + 1e-4)], name="x")
    assert rounded.numpy() == 1.0
    assert exact.numpy() == np.float32(1.0 + 1e-4)
    assert [call.fp16 for call in world.calls] == [True, False]


def test_sent_by_runs_the_code_as_another_rank_and_keeps_what_it_sent():
    averager = ModelStateAverager(_one_weight_model(7.0))
    sent = sent_by(2, 3, lambda: averager.exchange([tf.constant([[7.0]])], take_chief=True))
    # Rank 2 is no chief: it puts zeros into the sum that hands rank 0's state over.
    np.testing.assert_array_equal(sent["model_state_from_chief"], [[[0.0]]])
    sent = sent_by(0, 3, lambda: averager.exchange([tf.constant([[7.0]])], take_chief=True))
    np.testing.assert_array_equal(sent["model_state_from_chief"], [[[7.0]]])


def test_a_function_of_the_collectives_name_can_give_the_other_workers_values():
    def peers(name):
        return {1: [np.float32(4.0)]} if name.startswith("epoch_") else None

    with FakeComm(workers=2, rank=0, peers=peers):
        (total,) = comm.total([tf.constant(1.0)], name="epoch_2")
        assert total.numpy() == 5.0
        with pytest.raises(MissingPeerValues, match="'step_2'"):
            comm.total([tf.constant(1.0)], name="step_2")
