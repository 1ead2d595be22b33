"""--round-compression on two real workers (horovodrun --gloo): int8, int4, int2, int1 and
topk rounds leave both ranks with the same bits, and the run counts the bytes its rounds
encode. In one process: fp16 asked for by --fp16-allreduce (`LocalSGD(fp16_allreduce=True)`)
is the same fp16 rounds.

The one-process tests at K workers are in test_compressed_rounds_k_workers.py.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

import hvdtrain.keras as hk
from conftest import horovodrun, load_rank_files
from helpers import runs_on_learnable_data
from hvdtrain import comm
from hvdtrain.rounds import quantize
from hvdtrain.config import load_config
from hvdtrain.errors import ArgumentError, ConfigError
from hvdtrain.progress import TrainingProgress
from hvdtrain.training.build import save_plan, state_callback

# Rounds after steps 3 and 6 and at the epoch's end (after step 7); SGD with momentum,
# which each worker keeps (the default); float32 rounds unless a run names another
# (local mode's default is int8).
LOCAL = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=7, validate=False,
             warmup_epochs=0.0, lr_decay="constant", mode="local", n_sync=3,
             round_compression="none")
RUNS = {
    "none": LOCAL,
    "int8": dict(LOCAL, round_compression="int8"),
    "int4": dict(LOCAL, round_compression="int4"),
    "int2": dict(LOCAL, round_compression="int2"),
    "int1": dict(LOCAL, round_compression="int1"),
    "topk": dict(LOCAL, round_compression="topk"),
    "fp16": dict(LOCAL, round_compression="fp16"),
    "async_int8": dict(LOCAL, mode="async", round_compression="int8"),
    # each overlapped round taken a step after it starts (Streaming DiLoCo's tau)
    "async_merge_after_1": dict(LOCAL, mode="async", round_compression="int8", merge_after=1),
    # Adam's moments averaged: the first coded, the running squares in float32
    "int8_adam_state": dict(LOCAL, round_compression="int8", optimizer="adam", base_lr=1e-3,
                            average_optimizer_state=True),
    # LAMB's steps, each round's mean stretched to their length (--rescale-rounds)
    "int8_rescaled": dict(LOCAL, round_compression="int8", optimizer="lamb", rescale_rounds=True),
}
ROUND_STEPS = (3, 6)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("compressed")
    runs = runs_on_learnable_data(root, RUNS)
    horovodrun("hierarchical_worker.py", str(root), json.dumps(runs), np_=2, timeout=600)
    return {name: load_rank_files(str(root), name) for name in RUNS}


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of twelve trainings, kept out of make test
@pytest.mark.parametrize("name", ["int8", "int4", "int2", "int1", "topk", "fp16",
                                  "int8_adam_state", "int8_rescaled"])
def test_compressed_rounds_leave_both_ranks_with_the_same_bits_after_every_round(results, name):
    ranks = results[name]
    for step in range(7):
        same = np.array_equal(ranks[0]["steps"][step], ranks[1]["steps"][step])
        assert same == (step + 1 in ROUND_STEPS), step + 1
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of twelve trainings, kept out of make test
@pytest.mark.parametrize("name", ["async_int8", "async_merge_after_1"])
def test_async_int8_rounds_end_the_epoch_on_the_same_bits(results, name):
    ranks = results[name]
    np.testing.assert_array_equal(ranks[0]["final"], ranks[1]["final"])


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of twelve trainings, kept out of make test
def test_compressed_rounds_train_near_the_float32_rounds(results):
    plain = results["none"][0]["final"]
    for name in ("int8", "int4", "fp16"):
        moved = np.abs(results[name][0]["final"] - plain).max()
        assert moved < 0.02 * np.abs(plain).max(), name


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.long  # one horovodrun job of twelve trainings, kept out of make test
def test_the_summary_counts_the_bytes_a_compressed_round_encodes(results):
    summaries = {name: json.loads(str(results[name][0]["summary"])) for name in RUNS}
    plain = summaries["none"]
    # LeNet has no BatchNorm, and both modes leave the momentum with each worker by
    # default: a round carries the weights alone.
    assert plain["bytes_allreduced"] == plain["averaging_rounds"] * 4 * plain["parameters"]
    for name, compression, values in (("int8", "int8", 1), ("int4", "int4", 1), ("fp16", "fp16", 1),
                                      ("int2", "int2", 1), ("int1", "int1", 1),
                                      ("topk", "topk", 1), ("async_int8", "int8", 1),
                                      ("async_merge_after_1", "int8", 1)):
        summary = summaries[name]
        assert summary["averaging_rounds"] == plain["averaging_rounds"]
        assert summary["bytes_allreduced"] == summary["averaging_rounds"] * \
            quantize.payload_bytes(values * summary["parameters"], 2, compression), name
    adam = summaries["int8_adam_state"]
    assert adam["bytes_allreduced"] == adam["averaging_rounds"] * (
        quantize.payload_bytes(2 * adam["parameters"], 2, "int8") + 4 * adam["parameters"])
    # Rescaled rounds add a float per weight variable: LeNet-5's 5 kernels and 5 biases.
    rescaled = summaries["int8_rescaled"]
    assert rescaled["bytes_allreduced"] == rescaled["averaging_rounds"] * (
        quantize.payload_bytes(rescaled["parameters"], 2, "int8") + 4 * 10)
    # int8 rounds move about a quarter of float32's bytes (padding to whole chunks aside).
    assert summaries["int8"]["bytes_allreduced"] < 0.26 * plain["bytes_allreduced"]
    assert summaries["int4"]["bytes_allreduced"] < 0.13 * plain["bytes_allreduced"]
    assert summaries["int1"]["bytes_allreduced"] < 0.035 * plain["bytes_allreduced"]
    assert summaries["topk"]["bytes_allreduced"] < 0.021 * plain["bytes_allreduced"]


def test_round_compression_is_refused_in_sync_mode_in_one_line():
    with pytest.raises(ConfigError, match="^--round-compression needs --mode local or async, "
                                          "got --round-compression fp16 with --mode sync$"):
        load_config(None, {"round_compression": "fp16"})


def _batch_norm_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    return model


def _rounds(averager) -> list[tuple]:
    """How each fragment's rounds travel: compression, bytes, and the reference's size."""
    return [(part.compressed and part.compressed.compression, part.payload_bytes,
             len(part.reference or [])) for part in getattr(averager, "parts", [averager])]


@pytest.mark.parametrize("fragments", [1, 2])
def test_local_sgd_fp16_allreduce_builds_the_rounds_round_compression_fp16_does(fragments):
    comm.init()
    model = _batch_norm_model()
    built = [hk.LocalSGD(n_sync=2, round_fragments=fragments, **options).attach(model)
             for options in (dict(round_compression="fp16"), dict(fp16_allreduce=True),
                             dict(fp16_allreduce=True, round_compression="fp16"))]
    named, alias, both = map(_rounds, built)
    assert alias == both == named
    assert len(named) == fragments and all(kind == "fp16" for kind, _, _ in named)


def test_local_sgd_refuses_fp16_allreduce_with_int8_rounds_in_one_line():
    # In the Keras layer fp16_allreduce reaches only the rounds: beside int8 it would be lost.
    with pytest.raises(ArgumentError, match=r"^LocalSGD\(fp16_allreduce=True\) sends rounds "
                                            r"as float16, round_compression='int8' codes them: "
                                            r"give one$"):
        hk.LocalSGD(n_sync=2, fp16_allreduce=True, round_compression="int8")


@pytest.mark.parametrize("compression, rounds", [("none", "fp16"), ("fp16", "fp16"),
                                                  ("int8", "int8")])
def test_train_with_fp16_allreduce_sends_rounds_as_fp16_unless_another_compression_is_asked(
        compression, rounds):
    comm.init()
    cfg = load_config(None, dict(model="lenet", mode="local", n_sync=2, fp16_allreduce=True,
                                 round_compression=compression))
    callback = state_callback(cfg, _batch_norm_model(), TrainingProgress(0), save_plan(cfg))
    assert callback.averager.compressed.compression == rounds
