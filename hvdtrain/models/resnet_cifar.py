"""CIFAR-style ResNets of depth 6n+2 (He et al. 2016, section 4.2).

Three stages of n basic blocks with 16, 32 and 64 filters; shortcuts that change
shape subsample and zero-pad the channels (the paper's option A), so they add no
parameters: ResNet-20 has about 0.27 M.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from hvdtrain.errors import ConfigError

layers = keras.layers
_BN = dict(momentum=0.9, epsilon=1e-5)


def _conv(filters, stride, name):
    return layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                         kernel_initializer="he_normal", name=name)


@keras.utils.register_keras_serializable(package="hvdtrain")
class SubsampleZeroPad(layers.Layer):
    """Option-A shortcut: take every `stride`-th pixel, zero-pad the channels."""

    def __init__(self, stride: int, extra_channels: int, **kwargs):
        super().__init__(**kwargs)
        self.stride = stride
        self.extra_channels = extra_channels

    def call(self, x):
        x = x[:, ::self.stride, ::self.stride, :]
        before = self.extra_channels // 2
        return tf.pad(x, [[0, 0], [0, 0], [0, 0], [before, self.extra_channels - before]])

    def get_config(self):
        return {**super().get_config(), "stride": self.stride,
                "extra_channels": self.extra_channels}


def _shortcut(x, filters, stride, name):
    if stride == 1 and x.shape[-1] == filters:
        return x
    return SubsampleZeroPad(stride, filters - x.shape[-1], name=f"{name}_shortcut")(x)


def _block(x, filters, stride, name):
    y = _conv(filters, stride, f"{name}_conv1")(x)
    y = layers.BatchNormalization(name=f"{name}_bn1", **_BN)(y)
    y = layers.ReLU()(y)
    y = _conv(filters, 1, f"{name}_conv2")(y)
    y = layers.BatchNormalization(name=f"{name}_bn2", **_BN)(y)
    return layers.ReLU()(layers.Add()([_shortcut(x, filters, stride, name), y]))


def cifar_resnet(depth: int, input_shape, num_classes: int) -> keras.Model:
    if (depth - 2) % 6 != 0:
        raise ConfigError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    blocks = (depth - 2) // 6
    inputs = keras.Input(shape=input_shape)
    x = _conv(16, 1, "stem_conv")(inputs)
    x = layers.ReLU()(layers.BatchNormalization(name="stem_bn", **_BN)(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _block(x, filters, stride, f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")
