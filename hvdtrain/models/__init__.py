"""Models by name: `build_model(name, input_shape, num_classes)` returns a built Keras model.

Every model outputs logits (no softmax), so the loss uses `from_logits=True` and a
mixed-precision policy can keep the last layer in float32.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from hvdtrain.errors import ConfigError
from hvdtrain.models.alexnet import alexnet
from hvdtrain.models.lenet import lenet5
from hvdtrain.models.resnet50 import resnet50
from hvdtrain.models.resnet_cifar import cifar_resnet

_REGISTRY: dict[str, Callable[..., tf.keras.Model]] = {
    "alexnet": alexnet,
    "alexnet-lrn": lambda input_shape, num_classes: alexnet(input_shape, num_classes, lrn=True),
    "lenet": lenet5,
    "resnet50": resnet50,
    "resnet20": lambda input_shape, num_classes: cifar_resnet(20, input_shape, num_classes),
    "resnet32": lambda input_shape, num_classes: cifar_resnet(32, input_shape, num_classes),
    "resnet56": lambda input_shape, num_classes: cifar_resnet(56, input_shape, num_classes),
}


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def build_model(name: str, input_shape, num_classes: int) -> tf.keras.Model:
    if name not in _REGISTRY:
        raise ConfigError(f"--model must be one of {', '.join(model_names())}, got {name!r}")
    return _REGISTRY[name](tuple(input_shape), int(num_classes))
