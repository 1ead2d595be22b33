"""--round-fragments on two real workers (horovodrun --gloo): a period's round averages one
fragment of the model in turn, the epoch's end averages them all (every rank then holds the
same bits), and the run counts the bytes of the fragment each round sent.

How the model is cut into fragments is tested in test_round_fragments_split.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from helpers import agreeing_pieces, lenet_fragments, piece_size, runs_on_learnable_data
from hvdtrain.rounds import quantize

# LeNet, SGD with momentum kept by each worker (the default): a round carries the weights.
# Rounds after steps 3 and 6 (fragments 0 and 1), and at the epoch's end after step 7
# (every fragment); float32 rounds unless a run names another (local mode's default is int8).
LOCAL = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=7, validate=False,
             warmup_epochs=0.0, lr_decay="constant", mode="local", n_sync=3,
             round_compression="none")
RUNS = {
    "whole": LOCAL,
    "f2": dict(LOCAL, round_fragments=2),
    "f4": dict(LOCAL, round_fragments=4),
    "f2_int8": dict(LOCAL, round_fragments=2, round_compression="int8"),
    "async_f2": dict(LOCAL, mode="async", round_fragments=2),
}
ROUND_STEPS = {3: 0, 6: 1}  # the step after which a period's round runs: its fragment


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fragments")
    runs = runs_on_learnable_data(root, RUNS)
    horovodrun("hierarchical_worker.py", str(root), json.dumps(runs), np_=2, timeout=900)
    return {name: load_rank_files(str(root), name) for name in RUNS}


def _shapes(ranks) -> list:
    return json.loads(str(ranks[0]["shapes"]))


def _agreeing(ranks, step: int, fragments) -> set[tuple]:
    """The pieces of `fragments` both ranks hold to the bit after `step` (1-based)."""
    return agreeing_pieces(ranks[0]["steps"][step - 1], ranks[1]["steps"][step - 1],
                           _shapes(ranks), fragments)


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of five trainings, kept out of make test
@pytest.mark.parametrize("name", ["f2", "f2_int8"])
def test_a_period_round_leaves_only_its_fragment_agreeing_and_the_end_all(results, name):
    ranks = results[name]
    fragments = lenet_fragments(_shapes(ranks), 2)
    for step in range(1, 8):
        expected = set(fragments[ROUND_STEPS[step]]) if step in ROUND_STEPS else set()
        assert _agreeing(ranks, step, fragments) == expected, step
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of five trainings, kept out of make test
def test_overlapped_fragment_rounds_end_the_epoch_on_the_same_bits(results):
    ranks = results["async_f2"]
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])
    # The overlapped rounds' delayed update leaves no variable agreeing before the end.
    fragments = lenet_fragments(_shapes(ranks), 2)
    assert all(_agreeing(ranks, step, fragments) == set() for step in range(1, 8))


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of five trainings, kept out of make test
def test_the_summary_counts_the_fragment_each_period_round_sent(results):
    summaries = {name: json.loads(str(results[name][0]["summary"])) for name in RUNS}
    sizes, shapes = results["whole"][0]["sizes"], _shapes(results["whole"])
    whole = 4 * int(sum(sizes))
    assert summaries["whole"]["bytes_allreduced"] == 3 * whole
    for name, count in (("f2", 2), ("f4", 4), ("async_f2", 2)):
        fragments = lenet_fragments(shapes, count)
        sent = [4 * sum(piece_size(shapes, p) for p in fragments[k]) for k in ROUND_STEPS.values()]
        assert summaries[name]["averaging_rounds"] == 3, name
        # Two period rounds of one fragment each, and the end's round of all of them.
        assert summaries[name]["bytes_allreduced"] == sum(sent) + whole, name
    int8 = [quantize.payload_bytes(sum(piece_size(shapes, p) for p in fragment), 2, "int8")
            for fragment in lenet_fragments(shapes, 2)]
    assert summaries["f2_int8"]["bytes_allreduced"] == 2 * sum(int8)
