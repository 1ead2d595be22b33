"""AlexNet (Krizhevsky, Sutskever and Hinton 2012) as one tower.

Five convolutions and three fully connected layers with ReLU and dropout. The
paper splits conv2, conv4 and conv5 between its two GPUs; here that split is a
grouped convolution (groups=2), which keeps the paper's parameter count (about
61 M at 227x227 with 1000 classes). Local response normalisation is optional
(`lrn=True`); later work found it adds little. Inputs of 224 or 227 both reach
the paper's 6x6x256 before fc6; smaller inputs work too.
"""

from __future__ import annotations

import keras
import tensorflow as tf

layers = keras.layers


def _pool(x, name):
    # Overlapping 3x3/2 pooling as in the paper; pad only when the map is too small for it.
    padding = "valid" if min(x.shape[1], x.shape[2]) >= 3 else "same"
    return layers.MaxPooling2D(3, 2, padding=padding, name=name)(x)


@keras.saving.register_keras_serializable(package="hvdtrain")
class LocalResponseNormalization(layers.Layer):
    """The paper's local response normalisation across channels, as a named layer.

    Not a `Lambda`: Keras 3 refuses to load a Lambda's Python function from a saved
    model unless `safe_mode=False`, and one class keeps the constants in one place
    for both AlexNets.
    """

    def call(self, x):
        # The paper's k=2, n=5, alpha=1e-4, beta=0.75; TF's alpha is per element of the
        # window, the paper's is for the window's sum, hence alpha / n.
        return tf.nn.local_response_normalization(x, depth_radius=2, bias=2.0,
                                                  alpha=1e-4 / 5, beta=0.75)

    def compute_output_shape(self, input_shape):
        return input_shape


def _lrn(x, name):
    return LocalResponseNormalization(name=name)(x)


def alexnet(input_shape, num_classes: int, lrn: bool = False, dropout: float = 0.5,
            groups: int = 2) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    x = layers.ZeroPadding2D(2, name="pad1")(inputs)
    x = layers.Conv2D(96, 11, strides=4, activation="relu", name="conv1")(x)
    x = _lrn(x, "lrn1") if lrn else x
    x = _pool(x, "pool1")
    x = layers.Conv2D(256, 5, padding="same", groups=groups, activation="relu", name="conv2")(x)
    x = _lrn(x, "lrn2") if lrn else x
    x = _pool(x, "pool2")
    x = layers.Conv2D(384, 3, padding="same", activation="relu", name="conv3")(x)
    x = layers.Conv2D(384, 3, padding="same", groups=groups, activation="relu", name="conv4")(x)
    x = layers.Conv2D(256, 3, padding="same", groups=groups, activation="relu", name="conv5")(x)
    x = _pool(x, "pool5")
    x = layers.Flatten()(x)
    x = layers.Dense(4096, activation="relu", name="fc6")(x)
    x = layers.Dropout(dropout)(x)
    x = layers.Dense(4096, activation="relu", name="fc7")(x)
    x = layers.Dropout(dropout)(x)
    outputs = layers.Dense(num_classes, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="alexnet")
