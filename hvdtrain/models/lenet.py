"""LeNet-5 (LeCun et al. 1998) with ReLU and max pooling, for any small input."""

from __future__ import annotations

import keras

layers = keras.layers


def lenet5(input_shape, num_classes: int) -> keras.Model:
    height, width = input_shape[0], input_shape[1]
    if min(height, width) < 4:
        from hvdtrain.errors import ConfigError
        raise ConfigError(f"lenet needs images of at least 4x4, got {height}x{width}")
    # The original's second convolution is unpadded (10x10 from 14x14); on inputs too
    # small for that, pad it so the model still builds.
    second_padding = "valid" if min(height, width) // 2 >= 5 else "same"
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(6, 5, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.MaxPooling2D(2, name="pool1")(x)
    x = layers.Conv2D(16, 5, padding=second_padding, activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(2, name="pool2")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(120, activation="relu", name="fc1")(x)
    x = layers.Dense(84, activation="relu", name="fc2")(x)
    outputs = layers.Dense(num_classes, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="lenet")
