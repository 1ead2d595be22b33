"""Models by name: `build_model(name, input_shape, num_classes)` returns a built Keras model.

Every model outputs logits (no softmax), so the loss uses `from_logits=True` and a
mixed-precision policy can keep the last layer in float32.
"""

from __future__ import annotations

from typing import Callable

import keras

from hvdtrain.errors import ConfigError
from hvdtrain.models.alexnet import alexnet
from hvdtrain.models.alexnet_2col import alexnet_2col
from hvdtrain.models.lenet import lenet5
from hvdtrain.models.resnet50 import resnet50
from hvdtrain.models.resnet_cifar import cifar_resnet

# hvdtrain.config.MODELS repeats these names, so that a configuration can be checked before
# TensorFlow is imported; tests/test_models.py checks that the two agree.
_REGISTRY: dict[str, Callable[..., keras.Model]] = {
    "alexnet": alexnet,
    "alexnet-lrn": lambda input_shape, num_classes: alexnet(input_shape, num_classes, lrn=True),
    "alexnet-2col": alexnet_2col,
    "lenet": lenet5,
    "resnet50": resnet50,
    "resnet20": lambda input_shape, num_classes: cifar_resnet(20, input_shape, num_classes),
    "resnet32": lambda input_shape, num_classes: cifar_resnet(32, input_shape, num_classes),
    "resnet56": lambda input_shape, num_classes: cifar_resnet(56, input_shape, num_classes),
}


def model_names() -> list[str]:
    return sorted(_REGISTRY)


# Models that can split themselves over several devices (model parallelism).
SPLITTABLE = {"alexnet-2col"}


def build_model(name: str, input_shape, num_classes: int, devices=None) -> keras.Model:
    """`devices`: for a splittable model, the devices to place its parts on."""
    if name not in _REGISTRY:
        raise ConfigError(f"--model must be one of {', '.join(model_names())}, got {name!r}")
    if name in SPLITTABLE:
        return _REGISTRY[name](tuple(input_shape), int(num_classes), devices=devices)
    if devices is not None and len(devices) > 1:
        raise ConfigError(f"model {name} cannot be split over {len(devices)} devices")
    return _REGISTRY[name](tuple(input_shape), int(num_classes))
