"""--round-fragments: how the averaged state is cut into fragments (hvdtrain.rounds.fragments),
and the options it refuses. The rounds themselves, across processes, are in
test_round_fragments.py."""

from __future__ import annotations

import itertools

import pytest

from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.fragments import fragments_of, layer_units, split_evenly

# Layer bytes shaped like ResNet-20's (3x3 convolutions of 16, 32 and 64 channels, each
# followed by a small BatchNorm layer; the dense head last), in model order.
RESNET20 = ([432 * 4, 64] + [2304 * 4, 64] * 6 + [4608 * 4, 128] + [9216 * 4, 128] * 5
            + [512 * 4] + [18432 * 4, 256] + [36864 * 4, 256] * 5 + [2048 * 4] + [650 * 4])


def _sums(sizes, groups):
    return [sum(sizes[i] for i in group) for group in groups]


def test_fragments_are_contiguous_cover_every_unit_once_and_none_is_empty():
    for count in (1, 2, 3, 4, 7, len(RESNET20)):
        groups = split_evenly(RESNET20, count)
        assert len(groups) == count
        assert all(len(g) > 0 for g in groups)
        assert [i for g in groups for i in g] == list(range(len(RESNET20)))


def test_four_fragments_of_resnet20_each_hold_about_a_quarter_of_the_bytes():
    total = sum(RESNET20)
    for count in (2, 4, 8):
        largest = max(_sums(RESNET20, split_evenly(RESNET20, count)))
        # The smallest largest fragment: never under an even share, and since a cap of an
        # even share plus the largest layer always packs into `count` groups, never over.
        assert total / count <= largest <= total / count + max(RESNET20)


def test_the_largest_fragment_is_the_smallest_any_contiguous_split_gives():
    sizes = [5, 1, 1, 1, 5, 2, 9, 1, 3]
    best = min(max(sum(sizes[a:b]) for a, b in zip((0,) + cuts, cuts + (len(sizes),)))
               for cuts in itertools.combinations(range(1, len(sizes)), 3))
    assert max(_sums(sizes, split_evenly(sizes, 4))) == best


def test_boundaries_fall_at_the_nearest_unit_and_leave_a_unit_for_each_later_fragment():
    assert split_evenly([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert split_evenly([10, 1, 1, 1], 2) == [range(0, 1), range(1, 4)]
    # Every boundary's share lies inside the large last unit: each boundary goes as far as
    # it can while leaving one unit for each fragment after it.
    assert split_evenly([1, 1, 1, 100], 3) == [range(0, 2), range(2, 3), range(3, 4)]


def test_a_layers_variables_travel_in_one_fragment_even_when_apart_in_the_list():
    # Weights first, then statistics, then slots, as ModelStateAverager lists them.
    keys = ["conv", "bn", "dense", "bn", "bn", "conv", "dense"]
    assert layer_units(keys) == [[0, 5], [1, 3, 4], [2, 6]]
    groups = fragments_of(keys, [8, 1, 12, 1, 1, 8, 12], 2)
    assert groups == [[(0,), (1,), (3,), (4,), (5,)], [(2,), (6,)]]


def test_a_layer_whose_variables_share_their_columns_is_cut_between_columns():
    # LeNet-like: a small layer, a dense layer of 78% (kernel of 400 x 120, bias and
    # momentum slots: 120 columns alike), then an uncuttable one (a statistic: 0).
    keys = ["conv", "dense", "dense", "stat", "dense", "dense"]
    sizes = [2572, 48000, 120, 40, 48000, 120]
    columns = [16, 120, 120, 0, 120, 120]
    groups = fragments_of(keys, sizes, 4, columns)
    covered = {}
    for group in groups:
        for piece in group:
            span = range(piece[1], piece[2]) if len(piece) == 3 else range(columns[piece[0]] or 1)
            covered.setdefault(piece[0], []).extend(span)
    # Every column of every variable once; a layer's variables cut at the same columns.
    assert {i: sorted(c) for i, c in covered.items()} == {
        i: list(range(columns[i] or 1)) for i in range(len(keys))}
    for group in groups:
        cuts = {piece[1:] for piece in group if keys[piece[0]] == "dense"}
        assert len(cuts) <= 1
    # The largest fragment is an even share and at most one column of the dense layer.
    load = [sum(sizes[p[0]] * (p[2] - p[1]) // columns[p[0]] if len(p) == 3 else sizes[p[0]]
                for p in group) for group in groups]
    assert sum(load) == sum(sizes)
    assert max(load) <= sum(sizes) / 4 + (96240 // 120)
    # Whole layers could only cut the burst to 1 / 0.97.
    assert max(_sums([2572, 96240, 40], split_evenly([2572, 96240, 40], 3))) == 96240


@pytest.mark.parametrize("count, message", [
    (5, "^--round-fragments 5 is more than the 4 layers the rounds average: every "
        "fragment needs one$"),
    (0, "^--round-fragments must be a positive integer, got 0$"),
])
def test_an_impossible_fragment_count_is_refused_in_one_line_naming_it(count, message):
    with pytest.raises(ConfigError, match=message):
        split_evenly([4, 4, 4, 4], count)


LOCAL = dict(mode="local", n_sync=5)


@pytest.mark.parametrize("overrides, message", [
    (dict(LOCAL, round_fragments=0), "^--round-fragments must be a positive integer, got 0$"),
    ({"round_fragments": 4}, "^--round-fragments needs --mode local or async, got "
                             "--round-fragments 4 with --mode sync$"),
    (dict(LOCAL, round_fragments=4, outer_optimizer="slowmo"),
     "^--round-fragments 4 does not work with --outer-optimizer slowmo yet$"),
    (dict(mode="async", n_sync=None, sync_seconds=2.0, round_fragments=2),
     "^--round-fragments 2 does not work with --sync-seconds 2.0 yet$"),
])
def test_round_fragments_refuses_what_it_cannot_do_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_round_fragments_is_taken_in_local_and_async_modes():
    for mode in ("local", "async"):
        assert load_config(None, {"mode": mode, "round_fragments": 4}).round_fragments == 4


@pytest.fixture(scope="module")
def resnet20():
    import keras

    from hvdtrain.models import build_model

    model = build_model("resnet20", (32, 32, 3), 10)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _columns_of(fragmented):
    """Each averaged variable's columns in each fragment: {id: {fragment: columns}}."""
    held = {}
    for k, part in enumerate(fragmented.parts):
        for v in part.variables:
            variable = getattr(v, "variable", v)
            columns = range(v.start, v.stop) if hasattr(v, "start") else range(
                variable.shape[-1] if len(variable.shape) else 1)
            held.setdefault(id(variable), {}).setdefault(k, []).extend(columns)
    return held


def test_a_models_fragments_hold_each_averaged_column_once_a_layer_and_its_slots_together(
        resnet20):
    from hvdtrain.keras.fragmented_rounds import FragmentedAverager
    from hvdtrain.keras.state import ModelStateAverager, batch_norm_statistics

    whole = ModelStateAverager(resnet20, optimizer_state=True)
    fragmented = FragmentedAverager(resnet20, count=4, optimizer_state=True)
    held = _columns_of(fragmented)
    assert sorted(held) == sorted(id(v) for v in whole.variables)
    for v in whole.variables:  # every column once
        columns = sorted(c for cols in held[id(v)].values() for c in cols)
        assert columns == list(range(v.shape[-1] if len(v.shape) else 1))
    for mean, variance in batch_norm_statistics(resnet20):  # whole, in one fragment
        assert held[id(mean)].keys() == held[id(variance)].keys() and len(held[id(mean)]) == 1
    optimizer = resnet20.optimizer
    for weight in resnet20.trainable_variables:  # SGD's momentum slot is cut as its weight
        slot = optimizer.momentums[optimizer._get_variable_index(weight)]
        assert held[id(slot)] == held[id(weight)]
    # Every fragment holds a quarter, to within a column of a convolution: whole layers
    # cut the largest round only 3.6 times (the last stage's convolutions are 14% each).
    assert fragmented.payload_bytes == whole.payload_bytes
    assert whole.payload_bytes / fragmented.largest_burst > 3.95


def test_column_slices_read_and_assign_their_columns_in_and_out_of_a_graph():
    import keras
    import tensorflow as tf

    from hvdtrain.keras.fragmented_rounds import ColumnSlice
    from hvdtrain.keras.state import assign, read

    kernel = keras.Variable(tf.reshape(tf.range(12.0), [3, 4]), name="kernel")
    part = ColumnSlice(kernel, 1, 3)
    assert part.shape == (3, 2) and part.path == kernel.path
    assert read([part])[0].numpy().tolist() == [[1, 2], [5, 6], [9, 10]]
    tf.function(lambda: assign([part], [tf.convert_to_tensor(part) * 10]))()
    assert kernel.numpy().tolist() == [[0, 10, 20, 3], [4, 50, 60, 7], [8, 90, 100, 11]]


def test_four_fragments_of_lenet_cut_its_largest_round_four_times():
    import keras

    from hvdtrain import comm
    from hvdtrain.keras.fragmented_rounds import FragmentedAverager
    from hvdtrain.keras.state import ModelStateAverager
    from hvdtrain.models import build_model

    comm.init()  # a world of one worker: int8 rounds cut chunks by the workers
    model = build_model("lenet", (28, 28, 1), 10)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    whole = ModelStateAverager(model).payload_bytes
    for compression in ("none", "int8"):
        fragmented = FragmentedAverager(model, count=4, compression=compression)
        unfragmented = ModelStateAverager(model, compression=compression).payload_bytes
        # An even share plus at most one column of the first dense layer (401 values).
        assert unfragmented / fragmented.largest_burst > 3.9, compression
    assert whole == 61706 * 4


def test_the_keras_layer_refuses_fragments_it_cannot_average_in_one_line():
    from hvdtrain.errors import ArgumentError
    from hvdtrain.keras import LocalSGD

    with pytest.raises(ArgumentError, match=r"^LocalSGD\(round_fragments=4\) does not work with "
                                            r"outer_optimizer='slowmo' yet$"):
        LocalSGD(n_sync=5, round_fragments=4, outer_optimizer="slowmo")
    with pytest.raises(ArgumentError, match="^round_fragments must be a positive integer, "
                                            "got 0$"):
        LocalSGD(n_sync=5, round_fragments=0)
