"""Synthetic data kept on the device: the train step trains on it, whatever it is fed."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.data import load_dataset
from hvdtrain.data.device_synthetic import device_batch
from hvdtrain.models import build_model


def test_the_batch_is_made_on_the_device_asked_for_reproducibly_per_seed():
    images, labels = device_batch((8, 8, 3), 10, 16, seed=3, device="/device:CPU:0")
    assert images.device.endswith("CPU:0") and labels.device.endswith("CPU:0")
    assert images.shape == (16, 8, 8, 3) and labels.shape == (16,)
    assert 0 <= int(tf.reduce_min(labels)) and int(tf.reduce_max(labels)) < 10
    again, _ = device_batch((8, 8, 3), 10, 16, seed=3, device="/device:CPU:0")
    other, _ = device_batch((8, 8, 3), 10, 16, seed=4, device="/device:CPU:0")
    np.testing.assert_array_equal(images.numpy(), again.numpy())
    assert not np.allclose(images.numpy(), other.numpy())
    assert abs(float(tf.math.reduce_std(images)) - 1.0) < 0.1


def test_the_fed_stream_is_one_stand_in_image_of_the_real_shape_per_step():
    data = load_dataset("synthetic-device", synthetic_shape=(28, 28, 1), seed=0)
    stand_in_images, stand_in_labels = next(iter(data.train(0, 2, 32, seed=0)))
    assert stand_in_images.shape == (1, 28, 28, 1) and stand_in_labels.shape == (1,)
    # Evaluation reads the host-side test split, whole batches of real images.
    test_images, _ = next(iter(data.test(0, 1, 64)))
    assert test_images.shape == (64, 28, 28, 1)


def test_the_train_step_trains_on_the_device_batch_not_on_what_it_is_fed():
    data = load_dataset("synthetic-device", synthetic_shape=(28, 28, 1), seed=5)
    keras.utils.set_random_seed(0)
    model = build_model("lenet", data.input_shape, data.num_classes)
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data.feed_from_device(model, 16, "/device:CPU:0", rank=1)
    images, labels = device_batch(data.input_shape, 10, 16, seed=5 + 1, device="/device:CPU:0")
    expected = float(model.compute_loss(y=labels, y_pred=model(images)))

    stand_in = next(iter(data.train(1, 2, 16, seed=0)))
    logs = model.train_step(stand_in)
    assert float(logs["loss"]) == pytest.approx(expected, rel=1e-5)
