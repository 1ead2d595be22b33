"""ResNet-50 v1.5 (He et al. 2016, with the stride on the 3x3 convolution as in NVIDIA's
and torchvision's versions), about 25.6 M parameters at 1000 classes.

The last BatchNorm of each residual branch starts with gamma = 0, so every block
starts as the identity: Goyal et al. (2017) found this helps large-batch training.
"""

from __future__ import annotations

import keras

layers = keras.layers
_BN = dict(momentum=0.9, epsilon=1e-5)
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))


def _conv_bn(x, filters, kernel, stride, name, relu=True, zero_gamma=False):
    x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv")(x)
    x = layers.BatchNormalization(name=f"{name}_bn", gamma_initializer="zeros" if zero_gamma
                                  else "ones", **_BN)(x)
    return layers.ReLU(name=f"{name}_relu")(x) if relu else x


def _bottleneck(x, width, stride, name):
    shortcut = x
    if stride != 1 or x.shape[-1] != 4 * width:
        shortcut = _conv_bn(x, 4 * width, 1, stride, f"{name}_proj", relu=False)
    y = _conv_bn(x, width, 1, 1, f"{name}_1")
    y = _conv_bn(y, width, 3, stride, f"{name}_2")  # v1.5: the stride is here
    y = _conv_bn(y, 4 * width, 1, 1, f"{name}_3", relu=False, zero_gamma=True)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([shortcut, y]))


def resnet50(input_shape, num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    x = _conv_bn(inputs, 64, 7, 2, "stem")
    x = layers.MaxPooling2D(3, 2, padding="same", name="stem_pool")(x)
    for stage, (width, blocks, stride) in enumerate(STAGES, start=2):
        for block in range(blocks):
            x = _bottleneck(x, width, stride if block == 0 else 1, f"conv{stage}_block{block + 1}")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = layers.Dense(num_classes, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet50")
