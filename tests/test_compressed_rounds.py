"""--round-compression on two real workers (horovodrun --gloo): int8 rounds leave both ranks
with the same bits, and the run counts the bytes its rounds encode.

The one-process tests at K workers are in test_compressed_rounds_k_workers.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from helpers import runs_on_learnable_data
from hvdtrain import quantize
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError

# Rounds after steps 3 and 6 and at the epoch's end (after step 7); SGD with momentum,
# which each worker keeps (the default).
LOCAL = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=7, validate=False,
             warmup_epochs=0.0, lr_decay="constant", mode="local", n_sync=3)
RUNS = {
    "none": LOCAL,
    "int8": dict(LOCAL, round_compression="int8"),
    "fp16": dict(LOCAL, round_compression="fp16"),
    "async_int8": dict(LOCAL, mode="async", round_compression="int8"),
}
ROUND_STEPS = (3, 6)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("compressed")
    runs = runs_on_learnable_data(root, RUNS)
    horovodrun("hierarchical_worker.py", str(root), json.dumps(runs), np_=2, timeout=600)
    return {name: load_rank_files(str(root), name) for name in RUNS}


@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of four trainings, kept out of make test
@pytest.mark.parametrize("name", ["int8", "fp16"])
def test_compressed_rounds_leave_both_ranks_with_the_same_bits_after_every_round(results, name):
    ranks = results[name]
    for step in range(7):
        same = np.array_equal(ranks[0]["steps"][step], ranks[1]["steps"][step])
        assert same == (step + 1 in ROUND_STEPS), step + 1
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])


@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of four trainings, kept out of make test
def test_async_int8_rounds_end_the_epoch_on_the_same_bits(results):
    ranks = results["async_int8"]
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])


@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of four trainings, kept out of make test
def test_compressed_rounds_train_near_the_float32_rounds(results):
    plain = results["none"][0]["final"]
    for name in ("int8", "fp16"):
        moved = np.abs(results[name][0]["final"] - plain).max()
        assert moved < 0.02 * np.abs(plain).max(), name


@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of four trainings, kept out of make test
def test_the_summary_counts_the_bytes_a_compressed_round_encodes(results):
    summaries = {name: json.loads(str(results[name][0]["summary"])) for name in RUNS}
    plain = summaries["none"]
    # LeNet has no BatchNorm, and both modes leave the momentum with each worker by
    # default: a round carries the weights alone.
    assert plain["bytes_allreduced"] == plain["averaging_rounds"] * 4 * plain["parameters"]
    for name, compression, values in (("int8", "int8", 1), ("fp16", "fp16", 1),
                                      ("async_int8", "int8", 1)):
        summary = summaries[name]
        assert summary["averaging_rounds"] == plain["averaging_rounds"]
        assert summary["bytes_allreduced"] == summary["averaging_rounds"] * \
            quantize.payload_bytes(values * summary["parameters"], 2, compression), name
    # int8 rounds move about a quarter of float32's bytes (padding to whole chunks aside).
    assert summaries["int8"]["bytes_allreduced"] < 0.26 * plain["bytes_allreduced"]


def test_round_compression_is_refused_in_sync_mode_in_one_line():
    with pytest.raises(ConfigError, match="^--round-compression needs --mode local or async, "
                                          "got --round-compression fp16 with --mode sync$"):
        load_config(None, {"round_compression": "fp16"})
