"""Hybrid model and data parallelism: device assignment, the two-column AlexNet, its placement.

Logical CPU devices can only be made before TensorFlow initialises its devices, which
this pytest process has long done; so everything that needs two devices runs in a
fresh process (tests/workers/hybrid_worker.py), alone or under horovodrun.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import keras
import tensorflow as tf

from conftest import WORKERS_DIR, horovodrun, load_rank_files
from hvdtrain.machine.devices import configure_devices, model_parallel_devices, worker_gpus
from hvdtrain.errors import ConfigError
from hvdtrain.models.alexnet import alexnet
from hvdtrain.models.alexnet_2col import alexnet_2col, column_devices

CPU0, CPU1 = "/device:CPU:0", "/device:CPU:1"
WEIGHTED_LAYERS = ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7")


# --- which devices a worker uses (pure) ---

@pytest.mark.parametrize("model_parallel, local_rank, gpus, expected", [
    (2, 0, 4, [0, 1]),
    (2, 1, 4, [2, 3]),
    (1, 3, 4, [3]),
    (4, 1, 8, [4, 5, 6, 7]),
    (2, 5, 0, []),  # no GPUs: every worker splits its own CPU
])
def test_each_worker_owns_its_own_block_of_consecutive_gpus(model_parallel, local_rank, gpus,
                                                             expected):
    assert worker_gpus(model_parallel, local_rank, gpus) == expected


@pytest.mark.parametrize("model_parallel, local_rank, gpus, expected", [
    (2, 1, 4, ["/device:GPU:0", "/device:GPU:1"]),  # GPUs 2-3, renumbered once the rest are hidden
    (1, 1, 2, ["/device:GPU:0"]),
    (2, 1, 0, [CPU0, CPU1]),                        # two logical CPUs in every worker
    (1, 0, 0, [CPU0]),
])
def test_devices_are_named_as_tensorflow_shows_them_after_configuration(
        model_parallel, local_rank, gpus, expected):
    assert model_parallel_devices(model_parallel, local_rank, gpus) == expected


@pytest.mark.parametrize("args, message", [
    ((2, 1, 2), ("not enough GPUs: the worker with local rank 1 needs GPUs 2-3 for "
                 "--model-parallel 2, but this machine has 2")),
    ((2, 0, 1), ("not enough GPUs: the worker with local rank 0 needs GPUs 0-1 for "
                 "--model-parallel 2, but this machine has 1")),
    ((1, 2, 2), ("not enough GPUs: the worker with local rank 2 needs GPU 2 for "
                 "--model-parallel 1, but this machine has 2")),
    ((0, 0, 0), "--model-parallel must be a positive integer, got 0"),
    ((True, 0, 0), "--model-parallel must be a positive integer, got True"),
    ((2, -1, 0), "local rank must be a non-negative integer, got -1"),
    ((2, 0, 1.5), "GPU count must be a non-negative integer, got 1.5"),
])
def test_impossible_device_requests_are_one_line_config_errors(args, message):
    with pytest.raises(ConfigError) as info:
        model_parallel_devices(*args)
    assert str(info.value) == message


def test_configure_devices_shows_a_worker_only_its_own_gpus(monkeypatch):
    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: gpus if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind=None: calls.append([d.name for d in devices]))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, enable: calls.append((device.name, enable)))
    assert configure_devices(2, 1) == ["/device:GPU:0", "/device:GPU:1"]
    assert calls == [["/physical_device:GPU:2", "/physical_device:GPU:3"],
                     ("/physical_device:GPU:2", True), ("/physical_device:GPU:3", True)]


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="splits the CPU only")
def test_configuring_devices_after_tensorflow_started_is_a_config_error():
    tf.constant(0.0)  # TensorFlow initialises its devices here (if nothing did before)
    with pytest.raises(ConfigError, match=r"^cannot give this worker 3 devices for "
                                          r"--model-parallel 3: TensorFlow has already "
                                          r"initialised its devices \(.*\); configure"):
        configure_devices(3, 0)


# --- the two-column AlexNet (one device) ---

@pytest.fixture(scope="module")
def alexnet_227():
    return alexnet_2col((227, 227, 3), 1000)


def test_two_columns_have_the_papers_61_million_parameters_at_224_and_227(alexnet_227):
    assert alexnet_227.count_params() == 60_965_224
    assert alexnet_2col((224, 224, 3), 1000).count_params() == 60_965_224
    for c in range(2):  # 6x6x256 before fc6, half in each column
        assert alexnet_227.get_layer(f"pool5_col{c}").output.shape[1:] == (6, 6, 128)


@pytest.mark.parametrize("input_shape, classes, lrn", [((8, 8, 1), 3, True), ((20, 24, 3), 7, False)])
def test_two_columns_take_any_small_input_and_output_float32_logits(input_shape, classes, lrn):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = alexnet_2col(input_shape, classes, lrn=lrn)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    out = model(np.ones((2, *input_shape), np.float32))
    assert out.shape == (2, classes) and out.dtype == tf.float32
    assert model.get_layer("fc7_col1").compute_dtype == "float16"


def _inbound_layers(layer):
    """The layers whose outputs `layer` reads (Keras 3 has no public inbound_nodes)."""
    return [node.operation for node in layer._inbound_nodes[0].parent_nodes]


def _weighted_inputs(model, name):
    """Names of the layers with weights (or "input") whose outputs feed layer `name`."""
    found, pending = set(), [model.get_layer(name)]
    while pending:
        for layer in _inbound_layers(pending.pop()):
            if isinstance(layer, keras.layers.InputLayer):
                found.add("input")
            elif layer.weights:
                found.add(layer.name)
            else:
                pending.append(layer)
    return found


def _both(layer):
    return {f"{layer}_col0", f"{layer}_col1"}


def test_columns_cross_only_at_conv3_and_the_fully_connected_layers(alexnet_227):
    expected = {"logits": _both("fc7")}
    for c in range(2):
        expected.update({
            f"conv1_col{c}": {"input"},
            f"conv2_col{c}": {f"conv1_col{c}"},
            f"conv3_col{c}": _both("conv2"),
            f"conv4_col{c}": {f"conv3_col{c}"},
            f"conv5_col{c}": {f"conv4_col{c}"},
            f"fc6_col{c}": _both("conv5"),
            f"fc7_col{c}": _both("fc6"),
        })
    assert {layer.name for layer in alexnet_227.layers if layer.weights} == set(expected)
    assert {name: _weighted_inputs(alexnet_227, name) for name in expected} == expected
    kernels = {name: alexnet_227.get_layer(name).kernel.shape for name in expected}
    assert kernels == {"logits": (4096, 1000), **{name: shape for c in range(2) for name, shape in {
        f"conv1_col{c}": (11, 11, 3, 48), f"conv2_col{c}": (5, 5, 48, 128),
        f"conv3_col{c}": (3, 3, 256, 192), f"conv4_col{c}": (3, 3, 192, 192),
        f"conv5_col{c}": (3, 3, 192, 128), f"fc6_col{c}": (6 * 6 * 256, 2048),
        f"fc7_col{c}": (4096, 2048)}.items()}}


def _split_one_tower_weights(one_tower, two_col):
    """Give the two-column model the one-tower model's weights, each column its half."""
    for layer in WEIGHTED_LAYERS:
        kernel, bias = one_tower.get_layer(layer).get_weights()
        if layer == "fc6":
            # One tower flattens (h, w, 256) maps; the columns flatten (h, w, 128) each, then join.
            height, width = one_tower.get_layer("pool5").output.shape[1:3]
            maps = kernel.reshape(height, width, 2, 128, -1)
            kernel = np.concatenate([maps[:, :, c].reshape(-1, kernel.shape[-1]) for c in range(2)])
        half = kernel.shape[-1] // 2
        for c in range(2):
            part = slice(c * half, (c + 1) * half)
            two_col.get_layer(f"{layer}_col{c}").set_weights([kernel[..., part], bias[part]])
    two_col.get_layer("logits").set_weights(one_tower.get_layer("logits").get_weights())


def test_two_columns_compute_the_grouped_one_tower_alexnet():
    # 99x99 leaves 2x2 maps before fc6, so the flattening order matters.
    keras.utils.set_random_seed(3)
    one_tower, two_col = alexnet((99, 99, 3), 10), alexnet_2col((99, 99, 3), 10)
    _split_one_tower_weights(one_tower, two_col)
    x = np.random.default_rng(3).uniform(0, 255, size=(4, 99, 99, 3)).astype("float32")
    expected = one_tower(x, training=False).numpy()
    assert np.abs(expected).max() > 1e-2
    np.testing.assert_allclose(two_col(x, training=False).numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
@pytest.mark.slow
@pytest.mark.parametrize("loss_scale", [False, True])
def test_training_step_with_colocated_gradients_matches_keras_tape_step(loss_scale):
    keras.utils.set_random_seed(4)
    ours, keras_own = (alexnet_2col((32, 32, 3), 10, dropout=0.0) for _ in range(2))
    keras_own.set_weights(ours.get_weights())
    initial = np.concatenate([w.ravel() for w in ours.get_weights()])
    rng = np.random.default_rng(4)
    x, y = rng.uniform(0, 255, size=(16, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 16)
    losses = []
    for model, eagerly in ((ours, False), (keras_own, True)):  # eagerly: Keras's GradientTape step
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        if loss_scale:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        # No XLA (Keras's "auto" would use it on a GPU): the comparison is of the gradients.
        model.compile(optimizer, run_eagerly=eagerly, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        losses.append(model.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                                verbose=0).history["loss"])
    trained = [np.concatenate([w.ravel() for w in m.get_weights()]) for m in (ours, keras_own)]
    assert np.abs(trained[0] - initial).max() > 1e-3
    np.testing.assert_allclose(trained[0], trained[1], rtol=1e-4, atol=1e-6)
    assert losses[0][0] > 0  # our step reports the loss too, as Keras's does
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def test_the_two_columns_go_on_one_or_two_devices():
    assert column_devices(None) == [None, None]
    assert column_devices([CPU1]) == column_devices(CPU1) == [CPU1, CPU1]
    assert column_devices((CPU0, CPU1)) == [CPU0, CPU1]
    with pytest.raises(ConfigError) as info:
        alexnet_2col((32, 32, 3), 10, devices=[CPU0, CPU1, "/device:CPU:2"])
    assert str(info.value) == ("alexnet-2col has 2 columns, so it runs on 1 or 2 devices, "
                               "got 3: /device:CPU:0, /device:CPU:1, /device:CPU:2")


# --- the model split over two logical CPU devices (a fresh process) ---

def _layer_column(name):
    """("conv3", 1) for a variable or op of layer conv3_col1; None outside the columns.

    Keras 3 names ops in a call "conv3_col1_1/..." and optimizer slots
    "sgd/conv3_col1_kernel_momentum", hence "/" or "_" after the layer's name.
    """
    match = re.search(r"(?:^|/)(conv\d|fc\d)_col(\d)[/_]", name)
    return (match.group(1), int(match.group(2))) if match else None


def _expected_device(name):
    """Column c's variables and ops belong on device c, the logits on device 0."""
    layer_column = _layer_column(name)
    if layer_column:
        return f"/device:CPU:{layer_column[1]}"
    return CPU0 if re.search(r"(?:^|/)logits[/_]", name) else None


def _misplaced(named_devices):
    return [(name, device) for name, device in named_devices
            if _expected_device(name) and not device.endswith(_expected_device(name))]


def _devices_checked(named_devices):
    return {_expected_device(name) for name, _ in named_devices} - {None}


def _assert_training_step_on_column_devices(step_ops):
    named = [(name, device) for name, _, device in step_ops]
    assert not _misplaced(named)
    assert _devices_checked(named) == {CPU0, CPU1}
    # Not a vacuous pass: the forward and the backward ops of every column layer were checked.
    seen = {(*_layer_column(name), name.startswith("gradients/")) for name, _ in named
            if _layer_column(name)}
    assert seen == {(layer, c, backward) for layer in WEIGHTED_LAYERS for c in range(2)
                    for backward in (False, True)}


@pytest.fixture(scope="module")
def placement(tmp_path_factory):
    out = tmp_path_factory.mktemp("placement")
    result = subprocess.run(
        [sys.executable, os.path.join(WORKERS_DIR, "hybrid_worker.py"), "placement", str(out)],
        check=False, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-5000:]
    with np.load(out / "placement.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.mark.long  # 15 seconds here
@pytest.mark.slow
def test_configure_devices_splits_the_cpu_into_two_logical_devices(placement):
    for key in ("devices", "devices_again", "logical_cpus"):
        assert placement[key].tolist() == [CPU0, CPU1], key


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
def test_split_model_computes_what_the_one_device_model_computes(placement):
    split = placement["out_split"]
    assert np.abs(split).max() > 1e-2  # logits large enough for the tolerance to mean something
    np.testing.assert_allclose(placement["out_single"], split, rtol=0, atol=1e-5)
    # ...and the split model's weight file loads into a model that is all on device 1.
    np.testing.assert_allclose(placement["out_moved"], split, rtol=0, atol=1e-5)


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
def test_a_whole_split_model_saved_as_keras_loads_again_and_predicts_the_same(placement):
    # Loaded in this process, which imported the module but never built the saved model.
    loaded = keras.models.load_model(str(placement["saved"]))
    assert type(loaded).__name__ == "ColocatedGradientsModel"
    assert {layer.placement for layer in loaded.layers if hasattr(layer, "placement")} == {None}
    np.testing.assert_allclose(loaded.predict(placement["saved_input"], verbose=0),
                               placement["saved_output"], rtol=0, atol=1e-5)
    assert loaded.optimizer.iterations.numpy() == 2  # the optimizer's state came too


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
def test_each_column_keeps_its_variables_and_optimizer_slots_on_its_device(placement):
    for key in ("variables", "optimizer_variables"):
        assert not _misplaced(placement[key]), key
        assert _devices_checked(placement[key]) == {CPU0, CPU1}, key
    assert len(placement["variables"]) == 2 * (2 * len(WEIGHTED_LAYERS)) + 2


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
def test_each_column_really_runs_on_its_device(placement):
    conv5_col0, conv5_col1, logits = placement["ran_on"]
    assert conv5_col0.endswith(CPU0) and conv5_col1.endswith(CPU1) and logits.endswith(CPU0)


@pytest.mark.long  # a process of two logical devices, or two loss-scale traces: 15 seconds here
def test_training_step_runs_each_columns_forward_and_backward_on_its_device(placement):
    _assert_training_step_on_column_devices(placement["step_ops"])


# --- hybrid: two Horovod workers, each with the model split over two devices ---

@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    horovodrun("hybrid_worker.py", "train", str(root), timeout=300)
    return {mode: load_rank_files(str(root), mode) for mode in ("sync", "local")}


@pytest.mark.multiprocess
@pytest.mark.long  # `hybrid` is one job of about 25 seconds here
def test_sync_hybrid_training_leaves_identical_weights_on_both_workers(hybrid):
    rank0, rank1 = hybrid["sync"]
    assert np.abs(rank0["initial"] - rank1["initial"]).max() > 1e-3  # the broadcast had work to do
    np.testing.assert_array_equal(rank0["weights"], rank1["weights"])
    assert np.abs(rank0["weights"] - rank0["initial"]).max() > 1e-4


@pytest.mark.multiprocess
@pytest.mark.long
def test_local_sgd_hybrid_training_ends_in_consensus_after_drifting_apart(hybrid):
    rank0, rank1 = hybrid["local"]
    np.testing.assert_allclose(rank0["weights"], rank1["weights"], rtol=0, atol=1e-6)
    assert np.abs(rank0["weights"] - rank0["initial"]).max() > 1e-4
    for rank in (rank0, rank1):
        history = json.loads(str(rank["history"]))
        assert history["averaging_rounds"] == [2]     # rounds after steps 2 and 4
        assert history["divergence"][0] > 1e-4  # the workers were apart before each round


@pytest.mark.multiprocess
@pytest.mark.long
def test_every_worker_splits_its_model_over_two_devices(hybrid):
    for mode, ranks in hybrid.items():
        for rank in ranks:
            assert rank["logical_cpus"].tolist() == rank["devices"].tolist() == [CPU0, CPU1], mode
            assert not _misplaced(rank["variables"]), mode
            assert _devices_checked(rank["variables"]) == {CPU0, CPU1}, mode
            _assert_training_step_on_column_devices(rank["step_ops"])



@pytest.mark.multiprocess
@pytest.mark.long  # with the hybrid jobs above; about 16 seconds here
def test_cli_hybrid_two_workers_times_two_devices(tmp_path):
    """`hvdtrain train --model alexnet-2col --model-parallel 2` under horovodrun."""
    out = tmp_path / "run"
    horovodrun("hvdtrain", "train", "--model", "alexnet-2col", "--model-parallel", "2",
               "--dataset", "synthetic", "--synthetic-shape", "32x32x3", "--batch-size", "8",
               "--epochs", "1", "--steps-per-epoch", "3", "--mode", "local", "--n-sync", "2",
               "--no-validate", "--out", str(out), timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["model_parallel"] == 2
    assert summary["averaging_rounds"] == 2 and summary["parameters"] > 0
