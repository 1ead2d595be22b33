"""AlexNet as Krizhevsky et al. (2012) drew it: two columns, one per device.

Each column holds half of every layer: conv1 48 filters, conv2 128, conv3 192,
conv4 192, conv5 128, fc6 and fc7 2048 units. The columns exchange activations only
where the paper's two GPUs did: conv3, fc6, fc7 and fc8 read both columns; conv1,
conv2, conv4 and conv5 read their own. This is the model parallelism Yadan et al.
(2013) measured; under Horovod every worker holds one split model and the workers
are data-parallel, their "model + data" hybrid.

With `devices=[d0, d1]`, column c's variables and ops live on `devices[c]` (fc8 on
d0) and the training step computes every gradient on the device of the op it
differentiates. With `devices=None` or one device it is the same function on one
device: layer names (`conv1_col0`, ...) and weight order do not depend on the
placement, so weights move between placements with `set_weights` or weight files.

It computes the same function as our one-tower `alexnet` (groups=2) once fc6's input
rows are reordered, with the same 60,965,224 parameters at 227x227 and 1000 classes;
except with `lrn=True`, where each column normalises over its own maps as on the
paper's GPUs, while the one-tower window also spans the boundary between the groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import keras
import tensorflow as tf

from hvdtrain.errors import ConfigError
from hvdtrain.models.alexnet import LocalResponseNormalization

layers = keras.layers

COLUMNS = 2
CONV_FILTERS = {"conv1": 48, "conv2": 128, "conv3": 192, "conv4": 192, "conv5": 128}
FC_UNITS = 2048
# Where Keras's registry finds this module's classes when a saved `.keras` model is loaded.
SAVED_PACKAGE = "hvdtrain.alexnet_2col"


def _device_scope(placement: str | None):
    # No scope at all for None: tf.device(None) would clear an enclosing device scope.
    return contextlib.nullcontext() if placement is None else tf.device(placement)


class _Placed:
    """Mixin: the layer creates its variables and runs its ops inside `tf.device(placement)`.

    A device scope around the construction of a Functional model places its variables
    only: when the model runs, Keras calls each layer again, outside that scope. So the
    layer carries its device and re-enters it on every call. The placement stays out of
    `get_config`: device names belong to a machine, not to the model.
    """

    def __init__(self, *args, placement: str | None = None, **kwargs):
        # Keras 3 layers may make state in __init__ rather than in build (Dropout's seed
        # generator): that belongs on the column's device too.
        with _device_scope(placement):
            super().__init__(*args, **kwargs)
        self.placement = placement

    def __call__(self, *args, **kwargs):
        with _device_scope(self.placement):
            return super().__call__(*args, **kwargs)

    def get_config(self):
        # Keras 3 builds the config of a layer without its own get_config (ours
        # LocalResponseNormalization) from the constructor's arguments, placement included.
        config = super().get_config()
        config.pop("placement", None)
        return config


def _placed_class(layer_class: type) -> type:
    """`layer_class` with `_Placed` mixed in, registered so that a saved model loads again.

    The base class's name keeps op names and saved configs those of the plain layer. They
    are all made and registered when this module is imported, so that `keras.models.
    load_model` finds them in a process that has built no model; a loaded layer has no
    placement (it is not in the config) and runs wherever TensorFlow puts it.
    """
    placed = type(layer_class.__name__, (_Placed, layer_class), {"__module__": __name__})
    return keras.saving.register_keras_serializable(package=SAVED_PACKAGE)(placed)


_PLACED_CLASSES = {layer_class: _placed_class(layer_class) for layer_class in (
    layers.ZeroPadding2D, layers.Conv2D, layers.MaxPooling2D, LocalResponseNormalization,
    layers.Concatenate, layers.Flatten, layers.Dense, layers.Dropout)}


def _on(device: str | None, layer_class: type, *args, **kwargs) -> layers.Layer:
    """A `layer_class` layer placed on `device` (None: wherever TensorFlow puts it)."""
    return _PLACED_CLASSES[layer_class](*args, placement=device, **kwargs)


@keras.saving.register_keras_serializable(package=SAVED_PACKAGE)
class ColocatedGradientsModel(keras.Model):
    """A Functional model whose training step keeps each gradient on its forward op's device.

    Keras's own step differentiates with a GradientTape, which leaves the gradient ops
    unplaced, so TensorFlow runs them all on its default device: the whole backward
    pass of a split model would run on device 0. `tf.gradients` (in the compiled step)
    colocates each gradient op with the op it differentiates, and the optimizer updates
    every variable on the variable's device.
    """

    def train_step(self, data):
        if tf.executing_eagerly():  # run_eagerly=True: tf.gradients needs a graph
            return super().train_step(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=True)
        loss = self.compute_loss(x, y, y_pred, sample_weight, training=True)
        self._track_loss(x, loss)
        variables = self.trainable_variables
        # The optimizer scales the loss (a LossScaleOptimizer by its dynamic scale) and
        # its `apply` unscales the gradients and skips overflowing steps, so nothing here
        # depends on the optimizer's type. `apply` is also where hvdtrain averages the
        # gradients across workers, so the step must go through it.
        # tf.gradients wants the tf.Variables under Keras's variables.
        grads = tf.gradients(self.optimizer.scale_loss(loss), [v.value for v in variables])
        self.optimizer.apply(grads, variables)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _track_loss(self, x, loss):
        """Feed the `loss` log as Keras's own step does: the mean over the samples seen.

        Horovod runs one replica per process (no tf.distribute strategy), so the loss
        needs no rescaling for the number of replicas.
        """
        batch_size = tf.shape(next(t for t in keras.tree.flatten(x) if t is not None))[0]
        self._loss_tracker.update_state(loss, sample_weight=batch_size)

    def make_train_function(self, force=False):
        # Without a tf.distribute strategy Keras builds the optimizer while tracing the
        # first step; its slots are then lifted out of the graph, which loses their
        # colocation with the model variables and puts them all on the default device.
        # Built eagerly here, each slot goes where its variable is.
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)


def column_devices(devices: Sequence[str] | str | None) -> list[str | None]:
    """The device of each column: two names, one name for both, or None (no placement)."""
    if devices is None:
        return [None] * COLUMNS
    devices = [devices] if isinstance(devices, str) else list(devices)
    if len(devices) == 1:
        return devices * COLUMNS
    if len(devices) != COLUMNS:
        raise ConfigError(f"alexnet-2col has {COLUMNS} columns, so it runs on 1 or {COLUMNS} "
                          f"devices, got {len(devices)}: {', '.join(map(str, devices))}")
    return devices


def _conv(x, device, layer, c, size, strides=1, padding="same"):
    return _on(device, layers.Conv2D, CONV_FILTERS[layer], size, strides=strides,
               padding=padding, activation="relu", name=f"{layer}_col{c}")(x)


def _pool(x, device, name):
    # Overlapping 3x3/2 pooling as in the paper; pad only when the map is too small for it.
    padding = "valid" if min(x.shape[1], x.shape[2]) >= 3 else "same"
    return _on(device, layers.MaxPooling2D, 3, 2, padding=padding, name=name)(x)


def _lrn(x, device, name):
    return _on(device, LocalResponseNormalization, name=name)(x)


def _both(columns, device, name):
    """Both columns' activations, joined on `device`: one of the places the columns cross."""
    return _on(device, layers.Concatenate, name=name)(columns)


def _lower(inputs, c, device, lrn):
    """conv1 and conv2 of column c: they see only their own column."""
    x = _on(device, layers.ZeroPadding2D, 2, name=f"pad1_col{c}")(inputs)
    x = _conv(x, device, "conv1", c, 11, strides=4, padding="valid")
    x = _lrn(x, device, f"lrn1_col{c}") if lrn else x
    x = _pool(x, device, f"pool1_col{c}")
    x = _conv(x, device, "conv2", c, 5)
    x = _lrn(x, device, f"lrn2_col{c}") if lrn else x
    return _pool(x, device, f"pool2_col{c}")


def _upper(lower, c, device):
    """conv3 (reads both columns), conv4 and conv5 (own column) of column c, flattened."""
    x = _conv(_both(lower, device, f"conv3_in_col{c}"), device, "conv3", c, 3)
    x = _conv(x, device, "conv4", c, 3)
    x = _conv(x, device, "conv5", c, 3)
    x = _pool(x, device, f"pool5_col{c}")
    return _on(device, layers.Flatten, name=f"flatten_col{c}")(x)


def _fully_connected(previous, layer, c, device, dropout):
    """Column c's half of fc6 or fc7: it reads both columns."""
    x = _both(previous, device, f"{layer}_in_col{c}")
    x = _on(device, layers.Dense, FC_UNITS, activation="relu", name=f"{layer}_col{c}")(x)
    return _on(device, layers.Dropout, dropout, name=f"{layer}_dropout_col{c}")(x)


def alexnet_2col(input_shape, num_classes: int, devices: Sequence[str] | None = None,
                 lrn: bool = False, dropout: float = 0.5) -> keras.Model:
    """The two-column AlexNet; column c on `devices[c]`, logits (float32) on `devices[0]`."""
    placement = column_devices(devices)
    inputs = keras.Input(shape=input_shape)
    lower = [_lower(inputs, c, placement[c], lrn) for c in range(COLUMNS)]
    x = [_upper(lower, c, placement[c]) for c in range(COLUMNS)]
    for layer in ("fc6", "fc7"):
        x = [_fully_connected(x, layer, c, placement[c], dropout) for c in range(COLUMNS)]
    x = _both(x, placement[0], "fc8_in")
    outputs = _on(placement[0], layers.Dense, num_classes, name="logits", dtype="float32")(x)
    model = ColocatedGradientsModel(inputs, outputs, name="alexnet_2col")
    # XLA compiles a whole step for one device and fails on variables on another ("Trying
    # to access resource ... located in device ..."): a model on two devices declares it
    # cannot be jit-compiled, so Keras's "auto" (which compiles on a GPU) and
    # jit_compile=True both fall back to the plain graph, with Keras's warning for True.
    model.supports_jit = len(set(placement)) == 1
    return model
