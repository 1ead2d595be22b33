"""LARS, layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017, arXiv 1708.03888),
as a Keras 3 optimizer.

Each layer's step is scaled by its own trust ratio

    ratio = eta * |w| / (|g| + weight_decay * |w|)

(1 when |w| or |g| is 0), so a layer moves by about rate x eta of its weights' norm
whatever the size of its gradient: a large global batch's large rate no longer throws
the layers with small weights, or large gradients, out of range. With momentum m, as
the paper's Algorithm 1:

    v <- m * v + rate * ratio * (g + weight_decay * w)
    w <- w - v

Biases and BatchNorm's scales and offsets (names holding `bias`, `gamma`, `beta`, and
every variable of one dimension) take plain momentum SGD: no ratio, no weight decay.
The weight decay is the paper's, inside the step; Keras's own decoupled decay is not
used (the base class is given none).
"""

from __future__ import annotations

import keras
from keras import ops

# Variables that keep the global rate and no weight decay (Goyal et al. 2017, section 5.1;
# You et al. 2017 exclude them from the ratio too).
EXCLUDED_NAMES = ("bias", "gamma", "beta")


@keras.saving.register_keras_serializable(package="hvdtrain")
class LARS(keras.optimizers.Optimizer):
    """SGD with momentum and a per-layer trust ratio. The rate multiplies the ratio, which
    is about eta |w| / |g|: the rate that suits it is SGD's times |g| / (eta |w|)."""

    def __init__(self, learning_rate=1.0, momentum=0.9, eta=0.001, weight_decay=0.0,
                 exclude_names=EXCLUDED_NAMES, name="lars", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if eta <= 0 or weight_decay < 0:
            raise ValueError(f"eta must be positive and weight_decay not negative, got "
                             f"{eta} and {weight_decay}")
        self.momentum = float(momentum)
        self.eta = float(eta)
        # Not `weight_decay`: the base class would then also decay every step its own way.
        self.lars_weight_decay = float(weight_decay)
        self.exclude_names = tuple(exclude_names)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums = (self.add_optimizer_variables(variables, "momentum")
                          if self.momentum else [])

    def adapts(self, variable) -> bool:
        """Whether `variable` takes the trust ratio and the weight decay."""
        return len(variable.shape) > 1 and not any(
            name in variable.name for name in self.exclude_names)

    def update_step(self, gradient, variable, learning_rate):
        gradient = ops.cast(gradient, variable.dtype)
        step = ops.cast(learning_rate, variable.dtype) * (
            self._scaled(gradient, variable) if self.adapts(variable) else gradient)
        if not self.momentum:
            self.assign_sub(variable, step)
            return
        velocity = self.momentums[self._get_variable_index(variable)]
        self.assign(velocity, ops.add(ops.multiply(velocity, self.momentum), step))
        self.assign_sub(variable, velocity)

    def _scaled(self, gradient, variable):
        """ratio * (g + weight_decay * w), the ratio 1 where |w| or |g| is 0."""
        decay = ops.cast(self.lars_weight_decay, variable.dtype)
        w_norm = ops.sqrt(ops.sum(ops.square(variable)))
        g_norm = ops.sqrt(ops.sum(ops.square(gradient)))
        both = ops.logical_and(ops.greater(w_norm, 0), ops.greater(g_norm, 0))
        # The division in the branch not taken may be 0/0; `where` discards it.
        ratio = ops.where(both, self.eta * w_norm / (g_norm + decay * w_norm), 1.0)
        return ratio * (gradient + decay * variable)

    def get_config(self):
        config = super().get_config()
        config.update(momentum=self.momentum, eta=self.eta,
                      weight_decay=self.lars_weight_decay,
                      exclude_names=list(self.exclude_names))
        return config
